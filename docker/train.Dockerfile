# syntax=docker/dockerfile:1
# The training image: what every node runs (torchrun ranks, the per-node Prefect worker, the pipeline).
#
#   docker build -f docker/train.Dockerfile -t tandem-train .                      # from the repository root
#   docker build -f docker/train.Dockerfile --build-arg TORCH_CUDA_ARCH_LIST="8.0;8.6;9.0" -t tandem-train .
#
# CUDA 13.0 because the torch pinned in constraints.txt (2.13.0) is, on PyPI, a CUDA 13.0 build
# (it requires cuda-toolkit 13.0.3): DeepSpeed compiles its ops with this image's nvcc against that
# torch, and refuses a CUDA major version that differs from torch's. Pin the digest once you have
# pulled it (`docker buildx imagetools inspect nvidia/cuda:13.0.2-cudnn-devel-ubuntu22.04`) by
# appending @sha256:... to the FROM line; tests/unit/test_docker.py accepts either form.
FROM nvidia/cuda:13.0.2-cudnn-devel-ubuntu22.04

# Python 3.11 is what the project supports (pyproject.toml) and what every pin was resolved on.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-dev python3.11-venv git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
RUN python3.11 -m venv /opt/venv

WORKDIR /opt/tandem
# Dependencies before the source, so that editing the project does not rebuild DeepSpeed.
COPY constraints.txt pyproject.toml README.md ./

# Every pip call passes -c constraints.txt, as tools/install.sh does; TORCH_VERSION must equal the pin
# there (pip refuses a conflict, and tests/unit/test_docker.py compares them).
ARG TORCH_VERSION=2.13.0
# pip, setuptools and wheel are not in constraints.txt: pinned here (DeepSpeed builds without isolation).
RUN pip install "pip==25.3" "setuptools==80.9.0" "wheel==0.45.1" \
    && pip install -c constraints.txt "torch==${TORCH_VERSION}"

# DeepSpeed's ops are compiled here, once, for the GPUs named in TORCH_CUDA_ARCH_LIST (8.0 = A100,
# 9.0 = H100), so no rank JIT-compiles at start-up. There is no GPU during `docker build`: without
# DS_ACCELERATOR=cuda DeepSpeed would detect the CPU accelerator and build CPU ops instead.
# FUSED_ADAM is the optimizer of config/deepspeed/*.json on GPU; CPU_ADAM serves offload_optimizer.
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"
RUN DS_ACCELERATOR=cuda DS_BUILD_OPS=0 DS_BUILD_FUSED_ADAM=1 DS_BUILD_CPU_ADAM=1 \
    TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}" \
    pip install --no-build-isolation -c constraints.txt deepspeed

# The rest of the pinned stack (transformers, PEFT, bitsandbytes, Prefect, ...) from pyproject.toml, with the
# tracking extras the pipeline uses when `track` asks for them (MLflow also serves compose.yaml's MLflow server),
# and lm-evaluation-harness for eval.tasks.
COPY . .
RUN pip install -c constraints.txt -e ".[mlflow,tensorboard,tasks]" \
    && python -c "import deepspeed, peft, bitsandbytes, prefect, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# A non-root user owns only what runs write inside the checkout (.tandem/: extension cache, log scratch,
# and models/, where the built-in tiny model is cached when run.storage is on S3).
RUN useradd --create-home --uid 1000 tandem && mkdir -p /opt/tandem/.tandem/models && chown -R tandem /opt/tandem/.tandem
USER 1000:1000
# TANDEM_ROOT: the checkout that prefect.yaml's pull step makes the working directory of a flow run.
ENV TANDEM_ROOT=/opt/tandem \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    TORCH_EXTENSIONS_DIR=/opt/tandem/.tandem/torch_extensions \
    OMP_NUM_THREADS=1

ENTRYPOINT ["/opt/tandem/docker/entrypoint.sh"]
CMD ["--help"]
