"""Local servers for tests: started on 127.0.0.1, waited for with a bound, always stopped."""

import contextlib
import os
import socket
import subprocess
import sys
import time

VENV_BIN = os.path.dirname(sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def venv_env(**extra):
    # The worker pool starts SDK workers with the first `python` on PATH: it
    # must be this venv's, or workers cannot import dp_beam and the job hangs.
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def stop(proc, timeout=10.0):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


@contextlib.contextmanager
def server(args, port, log_path, timeout=30.0, env=None):
    """Runs ``args`` (which must listen on ``port``) for the duration of the block."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                env=env or venv_env(), start_new_session=True)
        try:
            wait_for_port(port, proc, timeout)
            yield proc
        finally:
            stop(proc)
