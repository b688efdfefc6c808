"""Tasks for tests/test_cluster.py, in a module of their own so the Dask worker processes import
them by name.  Each leaves a file NAME.PID in its folder when it starts, so a test can find (and
kill) the worker process running it."""
import os
import time


def sleepy(name: str, folder: str, seconds: float) -> dict:
    open(os.path.join(folder, f"{name}.{os.getpid()}"), "w").close()
    time.sleep(seconds)
    return {"task": name, "pid": os.getpid(), "env": os.environ.get("MTMC_TEST_ENV")}


def started(folder: str, name: str) -> list[int]:
    """The pids of the worker processes that started task `name`, in no order."""
    return [int(f.rsplit(".", 1)[1]) for f in os.listdir(folder) if f.rsplit(".", 1)[0] == name]
