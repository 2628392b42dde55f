"""A real Slurm cluster on this machine, for the suite: munged, slurmctld and two slurmd
"nodes", configured in a temporary directory and stopped by pid whatever happened.

Two forms:

- ``hosts``: each slurmd in a network namespace of its own with a hostname of its own (a
  UTS namespace), the two joined through a bridge in the root namespace where slurmctld
  listens; each node's link leaves its namespace through ``tbf`` at a rate the test picks, so
  ranks on the two nodes are on two hosts to MPI and to xbench, across a shaped link.
- ``local``: both slurmd on this host (``NodeAddr=127.0.0.1``, a port each), where network
  namespaces cannot be made.

Each node has 8 fake GPUs (``gres.conf`` entries that are character devices made with
mknod), so GPU-shaped scripts (``--gpus-per-node 8``, ``--gpus-per-task 1``) schedule.

Needs root and Debian's packages (``apt-get install --no-install-recommends slurmctld slurmd
slurm-client munge``; ``.ci/run`` installs them). ``python tests/slurm_cluster.py`` starts
one and waits, for trying things by hand (Ctrl-C or ``kill`` stops it).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = "slurmctld slurmd slurm-client munge"
DAEMONS = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "srun", "scontrol")
NET = "10.204.9"  # the bridge is .1, node i is .(i + 2)
GPUS_PER_NODE = 8
# Slurm's largest job id (MaxJobId's default); each cluster's first is drawn below it
MAX_JOB_ID = 67_043_328
LINK = "xbeth0"  # each node's network interface (hosts form)


def why_not() -> str | None:
    """Why a cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "starting Slurm's daemons needs root"
    missing = [
        d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()
    ]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing): "
            f"apt-get install --no-install-recommends {PACKAGES} (bash .ci/run does)"
        )
    if not Path("/etc/munge/munge.key").exists():
        return "munge has no key (/etc/munge/munge.key): reinstall the munge package"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


class SlurmCluster:
    """Start with :meth:`start`, stop with :meth:`stop` (idempotent; kills by pid)."""

    def __init__(self, root: Path, nodes: int = 2, form: str = "hosts", rate_bits: float = 200e6):
        self.root = Path(root)
        self.node_count = nodes
        self.form = form
        self.rate_bits = rate_bits
        # the owning process's id names what it makes (15 characters an interface's name
        # holds: xbs + 7 digits + the node's), so leftovers of a process gone are told apart
        self.tag = str(os.getpid())
        self.nodes = [f"xbn{i}" for i in range(nodes)]
        self.namespaces: list[str] = []
        self.links: list[str] = []  # the node side of each veth, inside its namespace
        self.bridge: str | None = None
        self.procs: list[subprocess.Popen] = []
        self.node_pids: list[int] = []
        self.partition = "xb"
        self.env: dict[str, str] = {}
        self.reason: str | None = None  # why this is not the form asked for (a fallback)

    # ------------------------------------------------------------------ set-up
    def start(self, timeout: float = 30.0) -> SlurmCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "owner").write_text(self.tag)
        for line in remove_leftovers():
            print(f"slurm_cluster: {line}", file=sys.stderr)
        try:
            if self.form == "hosts":
                self._make_hosts()
            self._write_config()
            self._start_daemons()
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _make_hosts(self) -> None:
        self.bridge = f"xbr{self.tag}"
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{NET}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i, _name in enumerate(self.nodes):
            ns, host_end, node_end = f"xbs{self.tag}{i}", f"xh{self.tag}{i}", LINK
            _run("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            # the node's end has the same name on every node, as a cluster's NICs do
            _run(
                "ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end, "netns", ns
            )
            _run("ip", "link", "set", host_end, "master", self.bridge)
            _run("ip", "link", "set", host_end, "up")
            _run("ip", "-n", ns, "addr", "add", f"{NET}.{i + 2}/24", "dev", node_end)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "link", "set", node_end, "up")
            _run("ip", "-n", ns, "route", "add", "default", "via", f"{NET}.1")
            self.links.append(node_end)
            self.shape(i, self.rate_bits)

    def shape(self, node: int, rate_bits: float) -> None:
        """What leaves node ``node`` goes through tbf at ``rate_bits`` (hosts form)."""
        ns, dev = self.namespaces[node], self.links[node]
        _run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
        _run(
            "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
            "rate", f"{int(rate_bits)}bit", "burst", "4kb", "latency", "200ms",
        )  # fmt: skip

    def on_node(self, node: int) -> list[str]:
        """The prefix that runs a command on node ``node``, as a login there would: its
        network, hostname and mounts (/etc/hosts, its TmpFS)."""
        return ["nsenter", "-t", str(self.node_pids[node]), "-n", "-u", "-m"]

    def address(self, node: int) -> str:
        return f"{NET}.{node + 2}" if self.form == "hosts" else "127.0.0.1"

    def _write_config(self) -> None:
        r = self.root
        for sub in (
            "state",
            "dev",
            "nodetmp",
            *(f"{p}-{n}" for p in ("tmp", "spool", "cgroup") for n in self.nodes),
        ):
            (r / sub).mkdir(exist_ok=True)
        cpus = os.cpu_count() or 1
        controller = socket.gethostname().split(".")[0]
        ctld_addr = f"{NET}.1" if self.form == "hosts" else "127.0.0.1"
        lines = [
            "ClusterName=xbench",
            f"SlurmctldHost={controller}({ctld_addr})",
            f"SlurmctldPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool-%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd-%n.log'}",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "GresTypes=gpu",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            # Job ids that no earlier cluster on this machine gave out, as a real cluster's
            # never repeat: under srun, MPICH names its node's init segment after the step
            # (/dev/shm/mpich_shm_<hash of "JOB.STEP">_<node>), a killed step leaves it, and
            # two ranks of a later step with the same id then spin in MPI_Init for good
            # (every cluster's first job was 1: a CI run hung in test_slurm_cluster.py).
            f"FirstJobId={random.randrange(1000, MAX_JOB_ID - 1_000_000)}",
            f"TmpFS={r / 'nodetmp'}",
        ]
        gres = []
        for i, name in enumerate(self.nodes):
            port = _free_port() if self.form == "local" else 6818
            hostname = name if self.form == "hosts" else controller
            lines.append(
                f"NodeName={name} NodeHostname={hostname} NodeAddr={self.address(i)} "
                f"Port={port} CPUs={cpus} RealMemory=1000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
            )
            # fake GPUs: slurmd needs files that are character devices (it counts them)
            for g in range(GPUS_PER_NODE):
                dev = r / "dev" / f"{name}-gpu{g}"
                if not dev.exists():
                    os.mknod(dev, 0o666 | 0o020000, os.makedev(195, g))
            gres.append(
                f"NodeName={name} Name=gpu File={r / 'dev'}/{name}-gpu[0-{GPUS_PER_NODE - 1}]"
            )
        lines.append(
            f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
        )
        (r / "slurm.conf").write_text("\n".join(lines) + "\n")
        names = [f"{self.address(i)} {name}" for i, name in enumerate(self.nodes)]
        (r / "hosts").write_text(
            "\n".join(["127.0.0.1 localhost", f"{NET}.1 {controller}", *names]) + "\n"
        )
        (r / "gres.conf").write_text("\n".join(gres) + "\n")
        (r / "cgroup.conf").write_text("")
        self.env = {"SLURM_CONF": str(r / "slurm.conf")}

    def _spawn(self, args: list[str], log: str) -> None:
        out = open(self.root / log, "ab")  # noqa: SIM115 (the daemon holds it)
        env = {**os.environ, **self.env}
        self.procs.append(
            subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
            )
        )

    def _start_daemons(self) -> None:
        run_munge = Path("/run/munge")
        if not (run_munge / "munge.socket.2").exists():
            run_munge.mkdir(parents=True, exist_ok=True)
            shutil.chown(run_munge, "munge", "munge")
            self._spawn(
                [
                    "setpriv",
                    "--reuid",
                    "munge",
                    "--regid",
                    "munge",
                    "--init-groups",
                    "/usr/sbin/munged",
                    "-F",
                ],
                "munged.out",
            )
            self._wait(lambda: (run_munge / "munge.socket.2").exists(), 10, "munged's socket")
        self._spawn(["slurmctld", "-D", "-i"], "slurmctld.out")
        for i, name in enumerate(self.nodes):
            # Every node in a mount namespace of its own: its TmpFS (where the PMIx plugin
            # makes a folder per step, named by job and step only) is its own, as a node's
            # local disk is; the rest of the file system is shared, as /home and /shared are.
            boot = [f"mount --bind {self.root / f'tmp-{name}'} {self.root / 'nodetmp'}"]
            prefix = ["unshare", "--mount", "sh", "-c"]
            if self.form == "hosts":
                # and its own hostname, an /etc/hosts that names the nodes, and its network
                # (nsenter, not ip netns exec: its fresh /sys hides /sys/fs/cgroup, without
                # which slurmd does not start)
                netns = f"--net=/run/netns/{self.namespaces[i]}"
                prefix = ["nsenter", netns, "unshare", "--uts", "--mount", "sh", "-c"]
                # and a /sys that shows its own network devices (UCX picks its interfaces
                # there), with the host's cgroup hierarchy put back under it for slurmd
                cgroup = self.root / f"cgroup-{name}"
                boot += [
                    f"mount --bind {self.root / 'hosts'} /etc/hosts",
                    f"hostname {name}",
                    f"mount --rbind /sys/fs/cgroup {cgroup}",
                    "mount -t sysfs sysfs /sys",
                    f"mount --rbind {cgroup} /sys/fs/cgroup",
                ]
            boot.append(f"exec slurmd -D -N {name}")
            self._spawn([*prefix, " && ".join(boot)], f"{name}.out")
            self.node_pids.append(self.procs[-1].pid)  # nsenter, unshare and sh exec slurmd

    def _wait(self, ready, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ready():
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(
                        f"{p.args[0]} exited {p.returncode} before {what}: {self.logs()}"
                    )
            time.sleep(0.2)
        raise RuntimeError(f"no {what} after {timeout:.0f} s: {self.logs()}")

    def _wait_idle(self, timeout: float) -> None:
        def idle() -> bool:
            r = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"],
                capture_output=True,
                text=True,
                env={**os.environ, **self.env},
            )
            states = [line.split()[-1] for line in r.stdout.splitlines() if line.strip()]
            return len(states) == self.node_count and all(s == "idle" for s in states)

        self._wait(idle, timeout, "idle nodes")

    def _kill_leftovers(self) -> None:
        """Every process still carrying this cluster's SLURM_CONF (slurmstepd, the job's
        script and tasks): each would hold a core, or spin in MPI, for the rest of the run."""
        if not self.env:
            return
        mark = f"SLURM_CONF={self.env['SLURM_CONF']}".encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if mark in (proc / "environ").read_bytes().split(b"\0"):
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue  # gone already, or not ours to read

    def logs(self) -> str:
        tails = []
        for log in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            text = log.read_text(errors="replace").strip().splitlines()[-5:]
            tails.append(f"[{log.name}] " + " | ".join(text))
        return "\n".join(tails)

    # ------------------------------------------------------------------ tear-down
    def stop(self) -> None:
        if self.procs and self.env:  # jobs first: their steps outlive slurmd otherwise
            env = {**os.environ, **self.env}
            subprocess.run(
                ["scancel", "--quiet", "--partition", self.partition], env=env, check=False
            )
            end = time.monotonic() + 10
            while time.monotonic() < end:
                queue = subprocess.run(
                    ["squeue", "-h", "-p", self.partition], capture_output=True, text=True, env=env
                )
                if queue.returncode != 0 or not queue.stdout.strip():
                    break
                time.sleep(0.2)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 10
        for p in reversed(self.procs):
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        self.node_pids.clear()
        self._kill_leftovers()
        for ns in self.namespaces:
            _run("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()
        if self.bridge:
            _run("ip", "link", "del", self.bridge, check=False)
            self.bridge = None


def _gone(pid: str) -> bool:
    return pid.isdigit() and not Path(f"/proc/{pid}").exists()


def remove_leftovers() -> list[str]:
    """What clusters of processes now gone left behind (a test run killed before its
    fixture stopped them): their daemons and jobs (each carries SLURM_CONF under a root
    whose ``owner`` is gone), bridges ``xbr<pid>`` and namespaces ``xbs<pid><node>``. Left,
    they hold the subnet and the node names, and every later cluster waits for idle nodes
    that never come. Returns one line for each thing removed."""
    said = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        conf = next((e[len(b"SLURM_CONF=") :] for e in env if e.startswith(b"SLURM_CONF=")), None)
        if conf is None:
            continue
        owner = Path(conf.decode(errors="replace")).parent / "owner"
        try:
            pid = owner.read_text().strip()
        except OSError:
            continue  # not a cluster of these tests
        if _gone(pid):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                said.append(f"killed process {proc.name} of a cluster whose test ({pid}) is gone")
            except OSError:
                pass
    names = _run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout
    for bridge in re.findall(r"^\d+: (xbr(\d+))[:@]", names, flags=re.M):
        if _gone(bridge[1]):
            _run("ip", "link", "del", bridge[0], check=False)
            said.append(f"removed bridge {bridge[0]} of a test gone")
    spaces = _run("ip", "netns", "list", check=False).stdout
    for ns in re.findall(r"^(xbs(\d+)\d)\b", spaces, flags=re.M):
        if _gone(ns[1]):
            _run("ip", "netns", "del", ns[0], check=False)
            said.append(f"removed network namespace {ns[0]} of a test gone")
    return said


if __name__ == "__main__":
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="start a Slurm cluster here and wait")
    parser.add_argument("--form", choices=("hosts", "local"), default="hosts")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    reason = why_not()
    if reason:
        raise SystemExit(reason)
    cluster = SlurmCluster(args.dir or Path(tempfile.mkdtemp(prefix="xbslurm-")), form=args.form)
    cluster.start()
    print(
        f"export SLURM_CONF={cluster.env['SLURM_CONF']}  # Ctrl-C or kill stops the cluster",
        flush=True,
    )

    def stop(signum, frame):  # kill (SIGTERM) too: a shell's background job ignores SIGINT
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
