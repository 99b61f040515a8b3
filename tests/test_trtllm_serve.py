"""How the GPU image starts tritonserver (issue 19, row 7) and which TensorRT-LLM example scripts the build runs
(row 6), pinned against the backend's own files: TensorRT-LLM ``triton_backend/scripts/launch_triton_server.py``
(``get_cmd``, ``add_multi_model_config``) and tensorrtllm_backend r26.07
``dockerfile/Dockerfile.triton.trt_llm_backend`` (``/app/examples`` from release/1.2.1). See docs/gpu.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from builders.trtllm import build as build_mod
from builders.trtllm.options import TrtllmOptions
from builders.trtllm.pins import (CONVERT_SCRIPT, DEFAULT_TRTLLM_SRC, IMAGE_TRTLLM_SRC_ROOTS, QUANTIZE_SCRIPT,
                                  TRTLLM_VERSION)
from builders.trtllm.multinode import SSH_DIR, SSH_PORT, GroupHosts
from builders.trtllm.serve import ORCHESTRATOR_FLAGS, WORKER_RANK_FLAGS, server_command

ROOT = Path(__file__).resolve().parents[1]
ENGINES = Path(__file__).parent / "fixtures" / "trtllm" / "engines"
TP2 = json.loads((ENGINES / "llama3-8b-fp16-tp2" / "config.json").read_text())
SINGLE = json.loads((ENGINES / "llama3-8b-fp16" / "config.json").read_text())


def _launcher_base() -> list[str]:
    """tritonserver's flags exactly as serving.launcher builds them for the GPU entry point."""
    from serving.launcher import ServerConfig, build_command
    from serving.triton_install import TritonInstall

    config = ServerConfig.from_env(Path("/repo"))
    config.drain = False
    install = TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), Path("/opt/tritonserver/backends"))
    return build_command(config, install, "k")[1:]


def _ranks(argv: list[str]) -> list[list[str]]:
    """Split an mpirun argv into the per-rank tritonserver argvs (after each ``-n 1``)."""
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    ranks, cur = [], None
    for a in argv[argv.index("-n"):]:  # after mpirun's own options
        if a == ":":
            ranks.append(cur)
            cur = None
        elif cur is None:
            assert a == "-n"
            cur = []
        elif cur == [] and a == "1":
            continue
        else:
            cur.append(a)
    ranks.append(cur)
    return ranks


def test_leader_mode_matches_launch_triton_server():
    argv, env = server_command("/repo", TP2, TrtllmOptions(multi_gpu_mode="leader"), _launcher_base())
    assert env == {}
    ranks = _ranks(argv)
    assert len(ranks) == 2  # one tritonserver per rank, world = tp × pp = 2
    for i, rank in enumerate(ranks):
        assert rank[0] == "/opt/tritonserver/bin/tritonserver" and rank[1] == "--model-repository=/repo"
        # like get_cmd: every rank has --disable-auto-complete-config and its own Python shm prefix, once
        assert rank.count("--disable-auto-complete-config") == 1
        assert rank[-1] == f"--backend-config=python,shm-region-prefix-name=prefix{i}_"
        # Rank 0 serves the ports; get_cmd gives every rank the same ones, where the C++ backend's worker ranks block
        # while loading. Our llm (Python) loads on a worker rank, so its tritonserver opens no endpoint instead.
        ports = [a for a in rank if a.startswith(("--http-port=", "--grpc-port=", "--metrics-port="))]
        assert ports == (["--http-port=8000", "--grpc-port=8001", "--metrics-port=8002"] if i == 0 else [])
        assert all(f in rank for f in WORKER_RANK_FLAGS) == (i > 0)
        control = [a for a in rank if a.startswith("--model-control-mode=")]
        if i == 0:
            # the launcher leaves rank 0 at Triton's default control mode, which is "none": we say it
            assert control == ["--model-control-mode=none"] and not any(a.startswith("--load-model") for a in rank)
        else:
            assert control == ["--model-control-mode=explicit"]
            assert [a for a in rank if a.startswith("--load-model=")] == ["--load-model=llm"]
        assert len(rank) == len(set(rank))  # no flag twice


def test_orchestrator_mode_matches_launch_triton_server():
    argv, env = server_command("/repo", TP2, TrtllmOptions(multi_gpu_mode="orchestrator"), _launcher_base(),
                               n_gpus=4)
    assert env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    assert argv[0] == "/opt/tritonserver/bin/tritonserver" and argv.count("--disable-auto-complete-config") == 1
    # add_multi_model_config: spawn mode gives the GPUs' memory to the workers, one pool flag per visible GPU
    assert all(f in argv for f in ORCHESTRATOR_FLAGS)
    assert [a for a in argv if a.startswith("--cuda-memory-pool-byte-size=")] == \
        [f"--cuda-memory-pool-byte-size={j}:0" for j in range(4)]
    assert "--model-control-mode=none" in argv and len(argv) == len(set(argv))


LWS_ENV = {"LWS_LEADER_ADDRESS": "llm-triton-llm-0.llm-triton-llm.serving", "LWS_GROUP_SIZE": "2",
           "LWS_WORKER_INDEX": "0"}


def test_a_leaderworkerset_group_places_the_ranks_over_ssh():
    """multiGpuMode leader on a LeaderWorkerSet of 2 pods × 1 GPU (the chart's worker pods run
    ``python -m builders.trtllm worker``, an sshd): rank 0 with the ports on the leader, rank 1 on worker 1."""
    group = GroupHosts.from_env(LWS_ENV, gpus_per_host=1)
    assert group.hosts == ["llm-triton-llm-0.llm-triton-llm.serving", "llm-triton-llm-0-1.llm-triton-llm.serving"]
    argv, env = server_command("/repo", TP2, TrtllmOptions(multi_gpu_mode="leader"), _launcher_base(), group=group)
    head = argv[:argv.index("-n")]
    assert head[:2] == ["mpirun", "--allow-run-as-root"] and env == {}
    assert head[head.index("--host") + 1] == "llm-triton-llm-0.llm-triton-llm.serving:1,llm-triton-llm-0-1.llm-triton-llm.serving:1"
    assert head[head.index("--map-by") + 1] == "slot" and "plm_rsh_agent" in head
    rsh = head[head.index("plm_rsh_args") + 1]
    assert f"-p {SSH_PORT}" in rsh and f"-i {SSH_DIR}/id_rsa" in rsh
    ranks = _ranks(argv)
    assert len(ranks) == 2 and "--http-port=8000" in ranks[0] and "--load-model=llm" in ranks[1]
    # the split the chart relies on: the ranks are the same as without a group, only placed
    plain, _ = server_command("/repo", TP2, TrtllmOptions(multi_gpu_mode="leader"), _launcher_base())
    assert _ranks(plain) == ranks


def test_a_group_must_hold_the_engine_ranks():
    assert GroupHosts.from_env({**LWS_ENV, "LWS_GROUP_SIZE": "1"}, 2) is None  # one pod: every rank local
    assert GroupHosts.from_env({}, 2) is None
    with pytest.raises(ValueError, match="2 ranks"):
        server_command("/repo", TP2, TrtllmOptions(multi_gpu_mode="leader"), _launcher_base(),
                       group=GroupHosts.from_env({**LWS_ENV, "LWS_GROUP_SIZE": "2"}, 2))


def test_single_gpu_is_one_plain_tritonserver():
    base = _launcher_base()
    argv, env = server_command("/repo", SINGLE, TrtllmOptions(multi_gpu_mode="leader"), base)
    assert env == {} and argv[:2] == ["/opt/tritonserver/bin/tritonserver", "--model-repository=/repo"]
    assert argv[2:] == [a for a in base if not a.startswith("--model-repository=")]
    assert not any(a in argv for a in ORCHESTRATOR_FLAGS)


def _tree(root: Path) -> Path:
    for rel in (CONVERT_SCRIPT, QUANTIZE_SCRIPT):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("# stand-in\n")
    return root


def test_example_scripts_come_from_the_image_first(tmp_path):
    image_layout_b, image_layout_a, downloaded = tmp_path / "app", tmp_path / "app" / "tensorrt_llm", tmp_path / "dl"
    roots = (str(image_layout_b), str(image_layout_a), str(downloaded))
    assert build_mod.find_trtllm_src(None, roots) == image_layout_b  # nothing anywhere: what --dry-run shows
    _tree(downloaded)
    assert build_mod.find_trtllm_src(None, roots) == downloaded  # only a TRTLLM_EXAMPLES=download image
    _tree(image_layout_a)
    assert build_mod.find_trtllm_src(None, roots) == image_layout_a  # the wheel's own examples beat the fork's
    _tree(image_layout_b)
    assert build_mod.find_trtllm_src(None, roots) == image_layout_b
    (image_layout_b / QUANTIZE_SCRIPT).unlink()  # a tree needs both scripts
    assert build_mod.find_trtllm_src(None, roots) == image_layout_a
    assert build_mod.find_trtllm_src(tmp_path / "mine", roots) == tmp_path / "mine"  # --trtllm-src / TRTLLM_SRC


def test_default_search_order_and_cli():
    assert IMAGE_TRTLLM_SRC_ROOTS == ("/app", "/app/tensorrt_llm")
    assert build_mod.find_trtllm_src.__defaults__[1] == (*IMAGE_TRTLLM_SRC_ROOTS, DEFAULT_TRTLLM_SRC)


def test_dry_run_without_the_image_shows_the_image_paths(monkeypatch, capsys):
    monkeypatch.delenv("TRTLLM_SRC", raising=False)
    ckpt = Path(__file__).parent / "fixtures" / "trtllm" / "hf" / "llama-3-8b"
    assert build_mod.engine_main(["--checkpoint", str(ckpt), "--output", "/tmp/o", "--variant", "fp8",
                                  "--gpu", "H100", "--dry-run"]) == 0
    assert f"/app/{QUANTIZE_SCRIPT}" in capsys.readouterr().out


def test_dockerfile_checks_the_same_roots_and_sets_no_trtllm_src():
    text = (ROOT / "Dockerfile").read_text()
    loop = re.search(r"for root in ([^;]+);", text)
    assert loop is not None and tuple(loop.group(1).split()) == IMAGE_TRTLLM_SRC_ROOTS
    assert "TRTLLM_SRC=" not in text  # an ENV would override the search and force the fork's scripts
    assert CONVERT_SCRIPT in text and QUANTIZE_SCRIPT in text and "ARG TRTLLM_EXAMPLES=image" in text
    assert DEFAULT_TRTLLM_SRC in text  # where =download puts them, the last root find_trtllm_src tries


@pytest.mark.parametrize("variant", ["fp16", "fp8"])  # convert_checkpoint.py, quantize.py
def test_missing_scripts_name_the_image_roots(variant, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from builders.trtllm.manifest import RuntimeInfo

    monkeypatch.setattr("builders.trtllm.manifest.detect_runtime", lambda: RuntimeInfo(TRTLLM_VERSION, "10"))
    with pytest.raises(SystemExit, match="/app or /app/tensorrt_llm"):
        build_mod._check_build_runtime(SimpleNamespace(trtllm_src=tmp_path, variant=variant), allow_other=False)


def test_a_worker_accepts_only_the_group_key(tmp_path):
    """``python -m builders.trtllm worker`` before it execs sshd: the Secret's key (group-readable, as a Secret with
    an fsGroup mounts it) copied 0600 for ssh, its public half the only authorized key, a host key of its own, and
    a config that allows key logins of this user only. (sshd itself ran by hand: docs/kubernetes.md.)"""
    import stat
    import subprocess

    from builders.trtllm.multinode import prepare_worker

    secret = tmp_path / "secret" / "id_rsa"
    secret.parent.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-N", "", "-f", str(secret)], check=True)
    secret.chmod(0o440)
    ssh_dir = tmp_path / "ssh"
    argv = prepare_worker(str(secret), ssh_dir, 2222)
    assert argv[1:] == ["-D", "-e", "-f", str(ssh_dir / "sshd_config")] and argv[0].endswith("sshd")
    copy = ssh_dir / "id_rsa"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600 and copy.read_bytes() == secret.read_bytes()
    public = (secret.parent / "id_rsa.pub").read_text().split()[:2]
    assert (ssh_dir / "authorized_keys").read_text().split()[:2] == public
    config = dict(line.split(" ", 1) for line in (ssh_dir / "sshd_config").read_text().splitlines())
    assert config["Port"] == "2222" and config["PasswordAuthentication"] == "no" and config["UsePAM"] == "no"
    assert config["AuthorizedKeysFile"] == str(ssh_dir / "authorized_keys") and (ssh_dir / "host_ed25519").exists()
    assert config["AllowTcpForwarding"] == "no" and len(config["AllowUsers"].split()) == 1
    # The leader's mpirun logs in with that same copy.
    group = GroupHosts.from_env(LWS_ENV, gpus_per_host=1)
    assert f"-i {SSH_DIR / 'id_rsa'}" in group.mpirun_args()[group.mpirun_args().index("plm_rsh_args") + 1]
