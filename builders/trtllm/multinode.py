"""A TensorRT-LLM engine larger than one node, as a LeaderWorkerSet group (helm/triton-llm, ``gpu.multiGpuMode:
leader`` with ``gpu.nodesPerReplica`` > 1; docs/kubernetes.md, "Multi-node").

The leader pod runs ``serve --multi-gpu-mode=leader``: mpirun starts every rank, the leader's own and, over ssh, the
workers' (serve.server_command). Each worker pod runs ``python -m builders.trtllm worker``: an sshd, as the
container's user on an unprivileged port, that accepts the group's key and nothing else. The key is a Secret both
mount, so the launch needs no Kubernetes API access from the pod (LWS's own TensorRT-LLM example uses
``kubectl exec``-style RBAC; the chart keeps ``automountServiceAccountToken: false``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

#: Where a group's workers listen for the leader's mpirun (sshd as the container's user: a port > 1024).
SSH_PORT = 2222
#: The group's private key as the chart mounts it (a Secret), and the 0600 copy ssh accepts (a Secret's files are
#: group-readable for the pod's fsGroup, which ssh refuses for a private key).
DEFAULT_SSH_KEY = "/etc/triton-llm/ssh/id_rsa"
SSH_KEY = os.environ.get("TRTLLM_SSH_KEY", DEFAULT_SSH_KEY)
SSH_DIR = Path("/tmp/triton-llm-ssh")
#: Environment the ranks on the workers get from the leader (the worker's sshd session has its own).
FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


class GroupHosts:
    """The hosts of a LeaderWorkerSet group, from the variables LWS gives every pod: ``LWS_LEADER_ADDRESS`` (the
    leader pod's DNS name ``<lws>-<group>.<lws>.<namespace>``) and ``LWS_GROUP_SIZE``. Worker ``i`` is the pod
    ``<lws>-<group>-<i>`` under the same headless Service."""

    def __init__(self, leader: str, size: int, gpus_per_host: int):
        if size < 1 or gpus_per_host < 1:
            raise ValueError(f"a group of {size} pods with {gpus_per_host} GPUs each")
        pod, _, domain = leader.partition(".")
        self.hosts = [leader] + [f"{pod}-{i}.{domain}" if domain else f"{pod}-{i}" for i in range(1, size)]
        self.gpus_per_host = gpus_per_host

    @classmethod
    def from_env(cls, env: dict[str, str], gpus_per_host: int) -> GroupHosts | None:
        """None outside a LeaderWorkerSet group of more than one pod (one pod: every rank is local)."""
        leader, size = env.get("LWS_LEADER_ADDRESS"), int(env.get("LWS_GROUP_SIZE") or 1)
        return cls(leader, size, gpus_per_host) if leader and size > 1 else None

    def mpirun_args(self, ssh_port: int = SSH_PORT, ssh_key: Path = SSH_DIR / "id_rsa") -> list[str]:
        """mpirun's placement (ranks fill the leader's GPUs first, then each worker's, in order) and its ssh
        launcher."""
        ssh = (f"-p {ssh_port} -i {ssh_key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
               "-o LogLevel=ERROR")
        return ["--host", ",".join(f"{h}:{self.gpus_per_host}" for h in self.hosts), "--map-by", "slot",
                "--bind-to", "none", "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", ssh,
                *[a for name in FORWARDED_ENV for a in ("-x", name)]]

    def wait_for_workers(self, timeout_s: float, ssh_port: int = SSH_PORT) -> None:
        """Until every worker's sshd accepts a connection (the pods of a group start together, the leader first
        or not); TimeoutError names those still missing."""
        deadline = time.monotonic() + timeout_s
        missing = list(self.hosts[1:])
        while missing:
            missing = [h for h in missing if not _accepts(h, ssh_port)]
            if missing and time.monotonic() > deadline:
                raise TimeoutError(f"no sshd on port {ssh_port} of {', '.join(missing)} after {timeout_s:.0f} s")
            if missing:
                time.sleep(2.0)


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


def private_key_copy(key: str = SSH_KEY, ssh_dir: Path = SSH_DIR) -> Path:
    """The group's key copied where ssh accepts it (0600, the container's user)."""
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    copy = ssh_dir / "id_rsa"
    copy.unlink(missing_ok=True)
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(Path(key).read_bytes())
    return copy


def sshd_config(ssh_dir: Path, port: int) -> str:
    """Key login for this user only: no password, no PAM (not root), no forwarding."""
    return "\n".join([
        f"Port {port}", f"HostKey {ssh_dir / 'host_ed25519'}", f"AuthorizedKeysFile {ssh_dir / 'authorized_keys'}",
        f"PidFile {ssh_dir / 'sshd.pid'}", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        # root only where the container runs as root (the GPU smoke test's docker run); key only even then
        "PubkeyAuthentication yes", "UsePAM no", "StrictModes no",
        f"PermitRootLogin {'prohibit-password' if os.getuid() == 0 else 'no'}", "AllowTcpForwarding no",
        "X11Forwarding no", "PermitUserEnvironment no", f"AllowUsers {_user()}", "LogLevel ERROR", ""])


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def prepare_worker(key: str = SSH_KEY, ssh_dir: Path = SSH_DIR, port: int = SSH_PORT) -> list[str]:
    """Host key, authorized_keys (the public half of the group's key) and config under ``ssh_dir``; the sshd argv."""
    copy = private_key_copy(key, ssh_dir)
    public = subprocess.run(["ssh-keygen", "-y", "-f", str(copy)], check=True, capture_output=True, text=True)
    (ssh_dir / "authorized_keys").write_text(public.stdout)
    host_key = ssh_dir / "host_ed25519"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    config = ssh_dir / "sshd_config"
    config.write_text(sshd_config(ssh_dir, port))
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    return [sshd, "-D", "-e", "-f", str(config)]


def worker_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m builders.trtllm worker",
                                description="a multi-node group's worker pod: wait for the leader's mpirun (sshd)")
    p.add_argument("--ssh-port", type=int, default=SSH_PORT)
    p.add_argument("--ssh-key", default=SSH_KEY, help="the group's private key (the chart's Secret)")
    p.add_argument("--print-only", action="store_true", help="prepare, then print the sshd command")
    args = p.parse_args(argv)
    command = prepare_worker(args.ssh_key, SSH_DIR, args.ssh_port)
    if args.print_only:
        print(" ".join(command))
        return 0
    os.execv(command[0], command)
    return 1
