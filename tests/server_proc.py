"""``python -m pagedcy serve`` as a subprocess on 127.0.0.1 (a free port), for the tests."""
import os
import signal
import subprocess
import sys
import time

import httpx


from pagedcy.tools.ports import free_port  # noqa: E402,F401  (re-exported for the tests)


class ServerProcess:
    """Starts the server, waits for /health; ``stop()`` sends SIGTERM and returns the exit code."""

    def __init__(self, model_dir, *args, env=None, log_path=None):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "pagedcy", "serve", "--model", str(model_dir),
               "--host", "127.0.0.1", "--port", str(self.port), *args]
        full_env = dict(os.environ, **(env or {}))
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("server did not answer /health in 120 s")
            time.sleep(0.1)

    def log(self) -> str:
        if not self.log_path:
            return ""
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self, timeout=30.0):
        """SIGTERM, then wait: the exit code (the process is killed if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self._log is not subprocess.DEVNULL:
            self._log.close()


def scrape(base_url):
    """/metrics parsed with prometheus_client's parser: {sample name[label values]: value}."""
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(base_url + "/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + "".join(f"[{s.labels[k]}]" for k in ("le", "finished_reason", "status")
                                   if k in s.labels)
            out[key] = s.value
    return out


def wait_for(pred, timeout=10.0):
    """Poll ``pred`` until it is true or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()
