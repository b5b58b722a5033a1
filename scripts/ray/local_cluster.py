"""A Ray cluster of several nodes on this one machine, loopback only, for trying `hydra/launcher=ray`
and for tests/slow/test_ray.py:

    python scripts/ray/local_cluster.py start     # head 127.0.0.2:26379 + a worker node on 127.0.0.3
    ablate sweep dpo_loss hydra/launcher=ray hydra.launcher.address=127.0.0.2:26379
    python scripts/ray/local_cluster.py stop      # stops exactly this cluster's processes

Each node is a real Ray node (its own raylet, object store and --temp-dir) on its own loopback
address: 127.0.0.2, 127.0.0.3, ... (not 127.0.0.1, which Ray silently replaces with the machine's
network address). Every port is set from --port (GCS = port; each node's others above it), so two
clusters on one machine do not collide. Ray's gRPC servers listen on all interfaces whatever
--node-ip-address says: the nodes use token authentication when RAY_AUTH_MODE=token is set (with
RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, the same for every driver); otherwise auth is explicitly off
(RAY_AUTH_MODE=disabled), so a stray ~/.ray/auth_token cannot switch the head alone to token mode.

`stop` ends the processes whose command line names this cluster's dir, and their children (the
Ray workers, whose command line Ray renames `ray::...`), not every Ray process of the machine as
`ray stop` does. Needs `pip install 'ablate[ray]'`; the nodes run this Python's `ray`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_DIR = "/tmp/ablate-ray"  # short: Ray's unix socket paths under it must stay below ~107 bytes
DEFAULT_PORT = 26379  # not Ray's default 6379: a cluster of the user's own may use that


def node_ip(i: int) -> str:
    return f"127.0.0.{2 + i}"


def ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


def node_args(i: int, port: int, cpus: int, base: Path, dashboard: bool) -> list[str]:
    """`ray start` arguments of node i (0 = head): its loopback address, its own ports and temp dir."""
    p = port + 10 * i  # node i's ports: p+1 .. p+8; worker ports: port+100*(i+1) .. +99
    args = [
        ray_cli(),
        "start",
        f"--node-ip-address={node_ip(i)}",
        f"--num-cpus={cpus}",
        "--num-gpus=0",
        f"--node-manager-port={p + 3}",
        f"--object-manager-port={p + 4}",
        f"--dashboard-agent-listen-port={p + 5}",
        f"--dashboard-agent-grpc-port={p + 6}",
        f"--metrics-export-port={p + 7}",
        f"--runtime-env-agent-port={p + 8}",
        f"--min-worker-port={port + 100 * (i + 1)}",
        f"--max-worker-port={port + 100 * (i + 1) + 99}",
        "--object-store-memory=100000000",
        f"--temp-dir={base / f'node{i}'}",
        "--disable-usage-stats",
    ]
    if i == 0:
        return [
            *args,
            "--head",
            f"--port={port}",
            f"--include-dashboard={str(dashboard).lower()}",
            f"--dashboard-host={node_ip(0)}",
            f"--dashboard-port={port + 1}",
            f"--ray-client-server-port={port + 2}",
        ]
    return [*args, f"--address={node_ip(0)}:{port}"]


def environment(base_env: dict[str, str] | None = None) -> dict[str, str]:
    """The nodes' environment (`base_env`, default this process's): auth mode explicit (the same
    must hold for every driver), no usage stats."""
    env = {**(os.environ if base_env is None else base_env), "RAY_USAGE_STATS_ENABLED": "0"}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("RAY_agent_register_timeout_ms", "300000")  # agents slow to register on a loaded machine
    # Ray renices its workers (the jobs) to 15; on a machine shared with other work they then starve:
    # a 2-job sweep here waited 9 minutes beside a test suite. The jobs get the priority they have
    # under every other launcher (workers start from the raylet's environment).
    env.setdefault("RAY_worker_niceness", "0")
    return env


def start(
    base: Path,
    port: int,
    nodes: int = 2,
    cpus: int = 1,
    dashboard: bool = False,
    attempts: int = 3,
    timeout: float = 240,
    env: dict[str, str] | None = None,
) -> str:
    """Start the cluster (head first); returns its address, HOST:PORT. A node that fails to start
    is retried (its raylet aborts when its Python agents take over 15 s to start: ray 2.60's
    WaitForDashboardAgentPorts, a fixed limit; a loaded machine or a cold page cache exceeds it), and
    after `attempts` failures every node already up is stopped."""
    base.mkdir(parents=True, exist_ok=True)
    env = environment(env)
    try:
        for i in range(nodes):
            for attempt in range(1, attempts + 1):
                t0 = time.time()
                # no session_latest of an earlier attempt
                shutil.rmtree(base / f"node{i}", ignore_errors=True)
                error = _start_node(
                    node_args(i, port, cpus, base, dashboard),
                    env,
                    base / f"node{i}",
                    timeout,
                    agent_port=port + 10 * i + 5,
                )
                if error is None:
                    print(f"node {i} up on {node_ip(i)} in {time.time() - t0:.1f}s", flush=True)
                    break
                print(
                    f"node {i} ({node_ip(i)}) did not start (attempt {attempt}/{attempts}): "
                    f"{error.splitlines()[0]}",
                    flush=True,
                )
                stop(base / f"node{i}")
                if attempt == attempts:
                    raise RuntimeError(
                        f"ray start of node {i} ({node_ip(i)}) failed {attempts} times; last: {error}; "
                        f"logs: {base / f'node{i}'}/session_latest/logs/raylet.err"
                    )
    except BaseException:
        stop(base)
        raise
    return f"{node_ip(0)}:{port}"


def _start_node(
    args: list[str], env: dict[str, str], node_dir: Path, timeout: float, agent_port: int
) -> str | None:
    """`ray start` for one node; None once it is up, else why not. A raylet that aborted (it says so
    in raylet.err) ends the attempt at once: `ray start` itself would wait ~100 s more to notice."""
    out = node_dir.parent / f"{node_dir.name}.start.log"
    with open(out, "w") as log:
        proc = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=node_dir.parent
        )
        deadline, announced = time.time() + timeout, False
        while proc.poll() is None:
            announced = announced or _announce_agent_port(node_dir, agent_port)
            aborted = [p for p in node_dir.glob("session_*/logs/raylet.err") if "Check failed" in _read(p)]
            if aborted or time.time() > deadline:
                proc.kill()
                proc.wait()
                if not aborted:
                    return f"no answer in {timeout:.0f}s"
                first = next((ln for ln in _read(aborted[0]).splitlines() if "Check failed" in ln), "")
                return f"raylet aborted: {first[first.find('Check failed') :][:300]}"
            time.sleep(0.2)
    return None if proc.returncode == 0 else f"exit {proc.returncode}: {_read(out)[-2500:]}"


def _announce_agent_port(node_dir: Path, port: int) -> bool:
    """ray 2.60's raylet aborts its node when the node's dashboard agent has not announced its HTTP
    port within 15 s (NodeManager::WaitForDashboardAgentPorts, a fixed limit, not
    agent_register_timeout_ms); on a loaded machine the agent's start-up (`import ray` and its modules)
    takes longer. The port is fixed here (--dashboard-agent-listen-port), so once the node's raylet
    runs, its port file is written the way the agent writes it (ray._raylet.persist_port); the agent
    writes the same number again when it is up. The raylet still fate-shares with the agent process.
    True once written."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if not cmd or not cmd[0].endswith("raylet"):
            continue
        temp = [a.split("=", 1)[1] for a in cmd if a.startswith("--temp_dir=")]
        if not temp or Path(temp[0]).resolve() != node_dir.resolve():
            continue
        flags = dict(a[2:].split("=", 1) for a in cmd[1:] if a.startswith("--") and "=" in a)
        if "session_dir" not in flags or "node_id" not in flags:
            return False
        try:
            from ray._raylet import DASHBOARD_AGENT_LISTEN_PORT_NAME, persist_port
        except ImportError:  # another Ray version: its raylet may not wait like this
            return True
        persist_port(flags["session_dir"], flags["node_id"], DASHBOARD_AGENT_LISTEN_PORT_NAME, port)
        return True
    return False


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def cluster_pids(base: Path) -> list[int]:
    """This cluster's processes: those whose command line names its dir, and all their descendants."""
    import psutil

    me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    # the dir, not followed by more of a name (node1 must not match node10)
    marker = re.compile(re.escape(str(base.resolve())) + r"(?![\w.-])")
    roots = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] not in me and marker.search(cmdline):
            roots.append(proc)
    pids = {p.pid for p in roots}
    for proc in roots:
        try:
            pids.update(c.pid for c in proc.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return sorted(pids - me)


def stop(base: Path, grace_s: float = 15.0) -> int:
    """SIGTERM this cluster's processes, SIGKILL those left after `grace_s`; returns how many there were."""
    import psutil

    procs = []
    for pid in cluster_pids(base):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return len(procs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument(
        "--dir", type=Path, default=Path(DEFAULT_DIR), help=f"the nodes' temp dirs (default {DEFAULT_DIR})"
    )
    parser.add_argument(
        "--port", type=int, default=None, help=f"the head's GCS port (default {DEFAULT_PORT})"
    )
    parser.add_argument("--nodes", type=int, default=2, help="nodes, head included (default 2)")
    parser.add_argument("--cpus", type=int, default=1, help="CPUs each node offers (default 1)")
    parser.add_argument(
        "--dashboard", action="store_true", help="start the dashboard (`ray list ...`; ~0.2 GB more)"
    )
    parser.add_argument("--clean", action="store_true", help="stop: also delete the dir (logs included)")
    args = parser.parse_args(argv)
    if args.command == "start":
        if cluster_pids(args.dir):
            sys.exit(f"a cluster is already running in {args.dir}: `python {sys.argv[0]} stop` first")
        address = start(args.dir, args.port or DEFAULT_PORT, args.nodes, args.cpus, args.dashboard)
        print(
            f"Ray cluster of {args.nodes} nodes up: hydra.launcher.address={address}  "
            f"(RAY_AUTH_MODE={environment()['RAY_AUTH_MODE']}; stop: python {sys.argv[0]} stop)"
        )
    else:
        n = stop(args.dir)
        if args.clean:
            shutil.rmtree(args.dir, ignore_errors=True)
        print(f"stopped {n} process(es) of the Ray cluster in {args.dir}")


if __name__ == "__main__":
    main()
