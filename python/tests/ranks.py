"""Worker processes of a two-rank run, started as a launcher would (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), and their outputs collected."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(rank: int, port: int, *argv: str) -> subprocess.Popen[str]:
    """``python *argv`` as rank ``rank`` of 2, the server at 127.0.0.1:``port``."""
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(procs: list[subprocess.Popen[str]], timeout_s: float = 120.0) -> list[tuple[int, str, str]]:
    """Each process's exit status, stdout and stderr; every process is killed if one outlives
    ``timeout_s``."""
    done = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        done.append((p.returncode, out, err))
    return done
