"""The running stack against the threats of docs/security.md: hostile clients on the health port, a
supervisord that stops answering, secrets and settings kept from rbln-smi and the logs, the files it
creates private, and the whole stack run by an unprivileged user."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Callable

import grpc

from kubelet_watchdog import health_server, metrics_server
from kubelet_watchdog.main import STEADY_CHECK_INTERVAL
from shared.node.rbln_smi import TOOL_ENVIRONMENT
from shared.supervision import transport
from shared.supervision.client import server_proxy
from simulator import smi_state
from simulator.node import SimulatedNode
from simulator.stack import ENTRYPOINT, StackProcess
from tests.support.hostile_http2 import CHECK, CHECK_WITHOUT_REQUEST, WATCH, ZeroWindowAttack
from tests.support.hostile_tcp import IdleConnections, ScrapeFlood, Slowloris
from tests.support.metrics_scrape import scrape_text
from tests.support.ports import free_port
from tests.support.supervision import (
    DEVICES,
    NODE,
    NOT_SERVING,
    SERVING,
    await_health,
    await_restarted_plugins,
    await_serving,
    health,
    program_info,
    registrations,
    status_command,
)
from tests.support.waiting import wait_until

NPU = "rebellions.ai/npu"
UNIMPLEMENTED = str(grpc.StatusCode.UNIMPLEMENTED.value[0])
NOBODY = 65534


def crit_lines(stack: StackProcess) -> list[str]:
    return [line for line in stack.stderr_lines if " CRIT " in line]


def probes_and_the_watchdog_hold(stack: StackProcess, kubelet, health_port: int, restarts: int = 1) -> None:
    """Under an attack: probes as the kubelet makes them are answered, and a kubelet restart (the `restarts`-th)
    is followed by every device plugin restarting and registering again and the probes passing again."""
    for _ in range(10):
        assert health(health_port, "liveness", timeout=1.0) == SERVING
        assert health(health_port, "readiness", timeout=1.0) == SERVING
    before = registrations(kubelet)
    kubelet.restart()
    await_restarted_plugins(stack, restarts=restarts)
    await_serving(kubelet, since=before)
    wait_until(lambda: health(health_port, "liveness", timeout=1.0) == SERVING
               and health(health_port, "readiness", timeout=1.0) == SERVING, 30, "the probes after the kubelet restart")


def attacked_stack(make_node, kubelet, start_stack) -> tuple[SimulatedNode, StackProcess, int, int]:
    """The stack on NODE with both ports on, serving; its health and metrics ports."""
    node = make_node(NODE)
    health_port, metrics_port = free_port(), free_port()
    stack = start_stack(node, HEALTHCHECK_PORT=str(health_port), METRICS_PORT=str(metrics_port))
    await_serving(kubelet)
    await_health(health_port, liveness=SERVING, readiness=SERVING)
    return node, stack, health_port, metrics_port


def test_the_health_port_answers_while_hostile_clients_hold_it_with_a_zero_window(make_node, kubelet,
                                                                                  start_stack):
    node, stack, port, _ = attacked_stack(make_node, kubelet, start_stack)
    # Replies that can never leave (Watch and Check on a closed window), and calls whose request never
    # comes: twice the 16 call slots the service once had, which they then used up.
    blocked_replies = ZeroWindowAttack(port, connections=6, streams=(WATCH, WATCH, CHECK, CHECK))
    missing_requests = ZeroWindowAttack(port, connections=8, streams=(CHECK_WITHOUT_REQUEST,) * 4)
    with blocked_replies, missing_requests:
        wait_until(lambda: blocked_replies.snapshot().grpc_status[(WATCH, UNIMPLEMENTED)] >= 12, 15,
                   "every Watch to be refused")
        probes_and_the_watchdog_hold(stack, kubelet, port)
        # State changes still reach Check: a program stopped and started again.
        supervisor = server_proxy(node.run_dir).supervisor
        supervisor.stopProcess("worker-npu-vf1")
        wait_until(lambda: health(port, "liveness") == NOT_SERVING, 15, "liveness to follow a stopped program")
        supervisor.startProcess("worker-npu-vf1")
        await_health(port, default=SERVING, liveness=SERVING, readiness=SERVING)
        # The server ends the stuck connections at their deadline (and the attacker opens them again).
        wait_until(lambda: missing_requests.snapshot().connections > 8 and blocked_replies.snapshot().connections > 6,
                   15, "the stuck connections ended at their deadline")
        attacked = blocked_replies.snapshot()
        missing = missing_requests.snapshot()
    # The attack held throughout: the server never got a byte of a reply message out to it.
    assert attacked.message_bytes == 0 and missing.message_bytes == 0


def held_then_dropped(attack, count: int, deadline: float, while_held: Callable[[], None]) -> None:
    """`while_held` runs while `attack` holds its `count` connections; each is dropped by the server within
    `deadline` of its opening (and opened again by the attacker)."""
    with attack:
        wait_until(lambda: attack.snapshot().opened >= count, 30, "every hostile connection open")
        while_held()
        wait_until(lambda: attack.snapshot().closed_by_server >= count, 30, "the hostile connections dropped")
        report = attack.snapshot()
    assert report.longest_seconds <= deadline + 2


def test_idle_connections_past_the_port_limit_never_keep_a_probe_out(make_node, kubelet, start_stack):
    _, stack, port, _ = attacked_stack(make_node, kubelet, start_stack)
    # Ten times the 64 connections the service once took, each opened again when the server drops it.
    held_then_dropped(IdleConnections(port, 640), 640, health_server.CONNECTION_DEADLINE,
                      lambda: probes_and_the_watchdog_hold(stack, kubelet, port))


def test_slowloris_clients_on_the_metrics_port_delay_no_scrape_and_no_probe(make_node, kubelet, start_stack):
    _, stack, health_port, metrics_port = attacked_stack(make_node, kubelet, start_stack)

    def scrapes_and_probes() -> None:
        for _ in range(5):
            assert "rbln_device_plugin_registered" in scrape_text(metrics_port)
        probes_and_the_watchdog_hold(stack, kubelet, health_port)

    # However it drips, a request has its deadline in all.
    held_then_dropped(Slowloris(metrics_port, 30, interval=1.0), 30, metrics_server.CONNECTION_DEADLINE,
                      scrapes_and_probes)


def test_clients_scraping_back_to_back_keep_no_probe_waiting(make_node, kubelet, start_stack):
    _, stack, health_port, metrics_port = attacked_stack(make_node, kubelet, start_stack)
    with ScrapeFlood(f"http://127.0.0.1:{metrics_port}/metrics", 4) as flood:
        probes_and_the_watchdog_hold(stack, kubelet, health_port)
    assert flood.ok > 10 and flood.failed == 0


def test_a_watchdog_that_cannot_reach_supervisord_reports_not_live_and_not_ready(make_node, kubelet, start_stack):
    node = make_node("1")
    port = free_port()
    stack = start_stack(node, HEALTHCHECK_PORT=str(port))
    kubelet.wait_for_devices(NPU, lambda view: view.connected, timeout=30)
    await_health(port, liveness=SERVING, readiness=SERVING)
    os.kill(stack.pid, signal.SIGSTOP)  # supervisord: its socket accepts, nothing answers
    try:
        # Asked every STEADY_CHECK_INTERVAL in a settled stack, its answer awaited for CALL_TIMEOUT.
        await_health(port, timeout=STEADY_CHECK_INTERVAL + transport.CALL_TIMEOUT + 15,
                     liveness=NOT_SERVING, readiness=NOT_SERVING)
    finally:
        os.kill(stack.pid, signal.SIGCONT)
    await_health(port, liveness=SERVING, readiness=SERVING)
    # Logged once (and only now seen: the programs' output goes through supervisord).
    (record,) = stack.wait_for_record("Cannot read program states; reporting not live and not ready")
    assert record["process"] == "watchdog" and record["level"] == "warn"
    assert f"did not answer within {transport.CALL_TIMEOUT:g}s" in record["err"]


def test_the_files_the_stack_creates_on_the_node_are_private_to_root_and_its_group(make_node, kubelet,
                                                                                   start_stack):
    node = make_node("1")
    start_stack(node)
    kubelet.wait_for_devices(NPU, lambda view: view.connected, timeout=30)
    wait_until(lambda: all(info["statename"] == "RUNNING" for info in program_info(node).values()), 15,
               "every program running")
    for name, info in program_info(node).items():
        with open(f"/proc/{info['pid']}/status") as status:
            assert "Umask:\t0027\n" in status.read(), name
    # Each program makes its log file when it first logs, which need not be before the NPU is served.
    # The node has whole NPUs only: the scanner, worker-npu and the watchdog run.
    wait_until(lambda: len(list(node.log_dir.glob("*.log"))) == 3, 15, "a log file for each of the 3 programs")
    assert {stat.S_IMODE(path.stat().st_mode) for path in node.log_dir.glob("*.log")} == {0o640}


def test_supervisord_starts_quietly_and_its_secret_stays_in_the_private_run_dir(make_node, kubelet, start_stack):
    node = make_node(NODE)
    stack = start_stack(node, OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer otlp-token")
    await_serving(kubelet)
    response = kubelet.allocate("rebellions.ai/npu-vf4", [sorted(DEVICES["rebellions.ai/npu-vf4"])])
    assert response.container_responses[0].devices
    secret = (node.run_dir / transport.CREDENTIALS_FILE).read_text()
    password = secret.split("password=")[1].strip()
    assert len(password) == 64

    # A process that supervisord did not start (`kubectl exec`) finds the credentials; nobody else gets in.
    env = {**os.environ, **node.env("200ms")}
    assert status_command(env).returncode == 0
    with socket.socket(socket.AF_UNIX) as anonymous:
        anonymous.connect(str(transport.socket_path(node.run_dir)))
        anonymous.sendall(b"POST /RPC2 HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
        assert anonymous.recv(100).startswith(b"HTTP/1.0 401")

    assert stat.S_IMODE(node.run_dir.stat().st_mode) == 0o700
    for private in (transport.socket_path(node.run_dir), node.run_dir / transport.CREDENTIALS_FILE):
        assert stat.S_IMODE(private.lstat().st_mode) == 0o600, private

    calls = node.smi_calls()
    assert {call["command"] for call in calls} >= {smi_state.INVENTORY, smi_state.GROUPS, smi_state.CREATE}
    for call in calls:
        assert set(call["environ"]) <= set(TOOL_ENVIRONMENT), call["argv"]
        assert call["environ"].get("TMPDIR") == str(node.run_dir)
    assert stack.stop() == 0
    assert crit_lines(stack) == []
    log_files = node.log_dir.glob("*.log")
    everything_written = [*stack.raw_lines, *stack.stderr_lines, *(path.read_text() for path in log_files)]
    assert not [text for text in everything_written if password in text or "otlp-token" in text]


def process_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("Uid:")).split()[1])


def children(pid: int) -> list[int]:
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                found.append(int(entry.name))
        except OSError:
            continue  # exited meanwhile
    return found


def unprivileged_run_command(node_root: pathlib.Path) -> list[str]:
    """`rbln-device-plugin run` as user nobody on the node in `node_root`, which it then owns.

    Reading is left to it everywhere (CAP_DAC_READ_SEARCH, kept across exec): the interpreter and this
    source tree may be under root's home. Everything it writes and owns is still user nobody's. Two
    things that only root could reach are put where nobody can: the interpreter (supervisord checks
    a program's command with access(), which ignores capabilities; a venv of copies, seeing this one's
    packages, is used) and the pipes to this test (chowned before the user changes)."""
    venv = node_root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--copies", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site_dir = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (pathlib.Path(site_dir) / "outer-environment.pth").write_text(
        "".join(f"{entry}\n" for entry in sys.path if entry.endswith("site-packages")))
    for path in [node_root, *node_root.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    return ["sh", "-c", f'chown {NOBODY}:{NOBODY} /proc/self/fd/1 /proc/self/fd/2 && exec "$@"', "sh",
            shutil.which("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
            str(python), "-c", ENTRYPOINT, "run"]


def test_the_stack_runs_as_an_unprivileged_user(make_node, node_root, kubelet):
    """supervisor.conf's user=root does not stop a user who cannot switch users: `run` tells supervisord
    to stay who it is, and every ownership check expects that user."""
    node = make_node("1")
    if os.geteuid() == 0:
        user, command = NOBODY, unprivileged_run_command(node_root)
        (node.plugin_dir / "kubelet.sock").chmod(0o666)  # the kubelet's, root's: let the workers connect
    else:
        user, command = os.geteuid(), [sys.executable, "-c", ENTRYPOINT, "run"]
    stack = StackProcess({**os.environ, **node.env("200ms")}, command=command).start()
    try:
        kubelet.wait_for_devices(NPU, lambda view: view.connected and view.updates > 0, timeout=60)
        # supervisord starts the programs by priority: the NPU served says nothing of the watchdog yet.
        # The node has whole NPUs only: the scanner, worker-npu and the watchdog.
        wait_until(lambda: len(children(stack.pid)) == 3, 15, "supervisord's three programs")
        programs = children(stack.pid)
        assert {process_uid(pid) for pid in [stack.pid, *programs]} == {user}
    finally:
        assert stack.stop() == 0
    assert crit_lines(stack) == []


def run_refused(node, **env) -> str:
    """`rbln-device-plugin run` that must refuse to start: its one line on stderr."""
    result = subprocess.run([sys.executable, "-c", ENTRYPOINT, "run"], env={**os.environ, **node.env("1s"), **env},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    return line


def test_run_refuses_a_run_dir_that_is_a_link_or_someone_elses(make_node, node_root):
    node = make_node("1")
    elsewhere = node_root / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    link = node_root / "linked-run"
    link.symlink_to(elsewhere)
    assert run_refused(node, RBLN_DEVICE_PLUGIN_RUN_DIR=str(link)) == \
        f"rbln-device-plugin run: RBLN_DEVICE_PLUGIN_RUN_DIR {link}: is a symbolic link"
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755 and list(elsewhere.iterdir()) == []
    if os.geteuid() == 0:
        os.chown(elsewhere, NOBODY, NOBODY)
        assert run_refused(node, RBLN_DEVICE_PLUGIN_RUN_DIR=str(elsewhere)) == \
            f"rbln-device-plugin run: RBLN_DEVICE_PLUGIN_RUN_DIR {elsewhere}: is owned by uid {NOBODY}, not 0"
