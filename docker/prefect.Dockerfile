# syntax=docker/dockerfile:1
# A slim Prefect image: the server (UI + API, on PostgreSQL in docker/compose.yaml), or a worker for
# pools whose flows need no ML stack. Nodes and the pipeline use docker/train.Dockerfile instead.
#
#   docker build -f docker/prefect.Dockerfile -t tandem-prefect .                  # from the repository root
#   docker run --rm -p 127.0.0.1:4200:4200 tandem-prefect                         # a server on SQLite
#
# Prefect and its two pins that keep the server working (fastapi<0.151, sqlalchemy<2.1) come from
# constraints.txt, so the server is the version the project was tested against. Pin the digest once
# pulled (@sha256:...), as in docker/train.Dockerfile.
FROM python:3.11.13-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false
COPY constraints.txt /tmp/constraints.txt
# asyncpg: the driver of PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://...
RUN pip install -c /tmp/constraints.txt prefect fastapi "sqlalchemy[asyncio]" asyncpg \
    && useradd --create-home --uid 1000 prefect
USER 1000:1000
WORKDIR /home/prefect
EXPOSE 4200
CMD ["prefect", "server", "start", "--host", "0.0.0.0", "--port", "4200"]
