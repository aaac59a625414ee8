"""Preflight: each classic multi-node failure is caught before training, with its one-line message.
Real sockets on 127.0.0.1, real files; no torchrun is needed to reach these checks."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from core.errors import RetryableError, UserError
from launch.command import free_port
from launch.job import NodePlan
from launch.preflight import check_port_free, run_preflight
from pipeline.plan import build_spec, record_model
from storage import layout
from storage.location import join
from storage.spec import write_spec
from tests.distributed.harness import Staged, config, stage


@pytest.fixture
def prepared(staged: Staged):
    """A written spec for a 2-node job, its URL and digest."""
    cfg = config(staged, "preflight", ["launch.nnodes=2"])
    spec = build_spec(
        cfg, "preflight", staged.model_path, staged.dataset, record_model(cfg, "preflight", staged.model_path)
    )
    digest = write_spec(spec)
    return spec, join(spec.run, layout.SPEC), digest


def check(prepared, plan: NodePlan, digest: str | None = None) -> dict:
    spec, url, real = prepared
    return run_preflight(spec, url, plan, expected_spec_digest=digest or real, info=lambda _: None)


def test_a_healthy_node_passes_and_leaves_a_report(prepared) -> None:
    report = check(prepared, NodePlan(0, 2, 1, "127.0.0.1", free_port()))
    assert set(report["checks"]) == {
        "world size",
        "code version",
        "spec digest",
        "base model",
        "master address",
        "master port",
        "gpus",
        "space",
        "memory",
        "dataset",
        "storage",
        "benchmark tasks",
        "environment",
        "forwarded environment",
        "interface",
        "hostname",
        "fabric",
    }
    # On 127.0.0.1 the route goes through the loopback interface, which both variables then name for the ranks.
    assert report["checks"]["interface"] == "lo (routes to 127.0.0.1; set as GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME)"
    assert report["checks"]["benchmark tasks"] == "none (eval.tasks)"
    assert not report["checks"]["hostname"].startswith("warning:")  # every node on this machine: nothing to warn
    spec = prepared[0]
    saved = json.loads(Path(str(layout.node_dir(spec.run, 0)), "preflight.json").read_text())
    assert saved["checks"]["dataset"].startswith(spec.dataset.dataset_id)
    assert " free, " in saved["checks"]["space"] and " needed" in saved["checks"]["space"]  # run.storage, local
    files = len(json.loads(Path(spec.run.url, layout.BASE_MODEL).read_text())["files"])
    # The pipeline's record hashed the model on this machine: the node's check found every digest in the node cache.
    assert (
        saved["checks"]["base model"].startswith(f"{files} files (")
        and f"{files} digests from the node" in (saved["checks"]["base model"])
    )


def test_port_taken_on_the_master(prepared) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(UserError, match=rf"^node 0: port {port} on 127.0.0.1 is already in use; pick another"):
            check(prepared, NodePlan(0, 2, 1, "127.0.0.1", port))


def test_a_port_whose_last_connections_linger_in_time_wait_is_free() -> None:
    """A retry on the same launch.master_port right after a failure: node 0's old store closed its connections first,
    so they sit in TIME_WAIT on that port. The store binds through them (SO_REUSEADDR), so the check must too."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's TCPStore binds
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server's side closes first: its end of the connection goes to TIME_WAIT
        client.close()
    assert check_port_free(NodePlan(0, 2, 1, "127.0.0.1", port)) == f"127.0.0.1:{port} free"


def test_unreachable_master(prepared) -> None:
    spec, url, digest = prepared
    quick = spec.model_copy(
        update={
            "config": spec.config.model_copy(
                update={"launch": spec.config.launch.model_copy(update={"rdzv_timeout": 2})}
            )
        }
    )
    port = free_port()
    with pytest.raises(
        RetryableError,
        match=rf"^node 1: cannot reach 127.0.0.1:{port} \(connection refused\) "
        "— is node 0 up and the port open\\?$",
    ):
        run_preflight(
            quick, url, NodePlan(1, 2, 1, "127.0.0.1", port), expected_spec_digest=digest, info=lambda _: None
        )


def test_unresolvable_master(prepared) -> None:
    with pytest.raises(UserError, match=re.escape("node 1: cannot resolve master address no-such-host.invalid")):
        check(prepared, NodePlan(1, 2, 1, "no-such-host.invalid", free_port()))


def test_rank_mismatch(prepared) -> None:
    with pytest.raises(UserError, match=r"node 2: rank mismatch: 3 nodes x 1 ranks .* resolved for 2 ranks"):
        check(prepared, NodePlan(2, 3, 1, "127.0.0.1", free_port()))


def test_another_spec_on_this_node(prepared) -> None:
    with pytest.raises(UserError, match=r"node 1: .*spec.json has sha256 .* the pipeline wrote 000000000000"):
        check(prepared, NodePlan(1, 2, 1, "127.0.0.1", free_port()), digest="0" * 64)


def test_different_code_on_this_node(prepared) -> None:
    spec, url, _ = prepared
    other = spec.model_copy(update={"code_version": "0.0.9+0123456789ab"})
    with pytest.raises(
        UserError,
        match=r"node 0: code version .* differs from 0.0.9\+0123456789ab in spec.json; "
        "install the same Tandem commit on every node",
    ):
        run_preflight(
            other, url, NodePlan(0, 2, 1, "127.0.0.1", free_port()), expected_spec_digest=None, info=lambda _: None
        )


def test_corrupted_dataset_file(tmp_path, tiny_model) -> None:
    private = stage(tmp_path / "storage", tiny_model)  # a copy of its own: the shared one stays intact
    spec = build_spec(config(private, "corrupt", ["launch.nnodes=2"]), "corrupt", private.model_path, private.dataset)
    digest = write_spec(spec)
    shard = Path(spec.dataset.url) / "train" / "shard-00000.arrow"
    data = bytearray(shard.read_bytes())
    data[64] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match=rf"node 0: {shard}: blake3 digest mismatch: expected [0-9a-f]+, got [0-9a-f]+"):
        run_preflight(
            spec,
            join(spec.run, layout.SPEC),
            NodePlan(0, 2, 1, "127.0.0.1", free_port()),
            expected_spec_digest=digest,
            info=lambda _: None,
        )


@pytest.mark.parametrize("damage", ["truncated", "missing", "changed"])
def test_a_node_whose_copy_of_the_model_differs_is_refused_naming_the_file(
    tmp_path, tiny_model, staged, damage
) -> None:
    """The pipeline recorded the model from its copy; this node's copy is cut short (an interrupted copy), lacks a
    file, or has other bytes of the same size: preflight stops the node before any rank starts, naming the file."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    cfg = config(staged, f"model-{damage}", ["launch.nnodes=2"])
    digest = record_model(cfg, f"model-{damage}", str(model))
    spec = build_spec(cfg, f"model-{damage}", str(model), staged.dataset, digest)
    spec_digest = write_spec(spec)
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncated":
        weights.write_bytes(data[: len(data) // 2])
        expected = rf"{weights}: {len(data) // 2} bytes, the pipeline's copy has {len(data)} \(an interrupted copy\?\)"
    elif damage == "missing":
        weights.unlink()
        expected = rf"{weights}: missing; copy the whole model directory to this node again"
    else:
        changed = bytearray(data)
        changed[-1] ^= 0xFF
        weights.write_bytes(bytes(changed))
        expected = rf"{weights}: blake3 [0-9a-f]{{16}}…, the pipeline's copy has [0-9a-f]{{16}}… \(another revision"
    with pytest.raises(UserError, match=rf"^node 1: base model: {expected}") as info:
        run_preflight(
            spec,
            join(spec.run, layout.SPEC),
            NodePlan(1, 2, 1, "127.0.0.1", free_port()),
            expected_spec_digest=spec_digest,
            info=lambda _: None,
            poll=None,
        )
    assert "\n" not in str(info.value)
