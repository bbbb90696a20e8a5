"""Run many short ``python -m TOOL ARGS`` commands fast: import once, fork for each.

Most bad-input cases end in the tool's parser, yet each ``python -m`` would first
import torch and the tool (1.3-1.6 s of CPU apiece). This server imports every
tool module given on its command line once, then, for each case it reads (a JSON
line ``{"module", "args", "cwd", "timeout"}`` on stdin), forks: the child changes
to ``cwd``, points its standard streams at files, and runs the module as
``__main__`` as ``python -m`` does, so its exit status, ``SystemExit``
and uncaught tracebacks are the tool's own (it leaves by ``os._exit`` after the
atexit handlers, skipping only the interpreter's teardown); the server answers one JSON line
``{"returncode", "stdout", "stderr"}`` per case, in order.

Only imports are shared: none of the tools starts MPI, threads or a device when
imported (a tool that does would have to be run by plain ``python -m``). The tool
modules themselves are imported and dropped again, so each child executes its
tool's code fresh, as ``__main__``, on the shared imports.

    python tests/forkrun.py commbench.allreduce analysis.report < cases.jsonl
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import shutil
import signal
import sys
import tempfile
import time
import traceback


def _child(case: dict, out_path: str, err_path: str) -> None:
    """In the forked child: become ``python -m module args`` run in ``cwd``."""
    os.chdir(case["cwd"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.argv = [case["module"], *case["args"]]
    # as ``python -m``: SystemExit sets the status (a message goes to stderr, status 1),
    # an uncaught exception prints its traceback and exits 1; atexit handlers run.
    # Then out without tearing the interpreter down (with torch loaded that takes ~0.8 s).
    try:
        runpy.run_module(case["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - reported as the interpreter would
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -signal.SIGKILL
        time.sleep(0.005)


def serve(modules: list[str]) -> None:
    for m in modules:  # what each tool imports ...
        importlib.import_module(m)
    for m in modules:  # ... while the tools themselves run afresh, as __main__
        sys.modules.pop(m, None)
    tmp = tempfile.mkdtemp(prefix="forkrun")
    out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
    try:
        for line in sys.stdin:
            case = json.loads(line)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:  # the child never leaves this branch, even if setting up fails
                try:
                    _child(case, out_path, err_path)  # ends in os._exit
                finally:
                    os._exit(1)
            rc = _wait(pid, float(case.get("timeout", 120)))
            with open(out_path) as o, open(err_path) as e:
                answer = {"returncode": rc, "stdout": o.read(), "stderr": e.read()}
            print(json.dumps(answer), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    serve(sys.argv[1:])
