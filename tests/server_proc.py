"""server_proc.py — start `moeserve serve` (or any moeserve command) on loopback with a
deadline for the Python tests: either it answers /health (started) or it exits (refused),
and what it printed comes back.  A server that neither answers nor exits by the deadline
counts as a hang.  Every process started here is killed by stop().  check() records one
result; finish() prints the closing "N passed, N failed" line and exits."""
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import sys
import urllib.request

MOESERVE = os.environ.get("MOESERVE", "build/moeserve")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Proc:
    def __init__(self, args, env=None, deadline_s=120.0, wait_health=True):
        self.port = free_port()
        self.log = tempfile.TemporaryFile(mode="w+")
        full = [MOESERVE] + args
        if wait_health:
            full += ["--host", "127.0.0.1", "--port", str(self.port)]
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen(full, stdout=self.log, stderr=subprocess.STDOUT, env=e,
                                  start_new_session=True)
        self.started = False
        self.hung = False
        t_end = time.time() + deadline_s
        while time.time() < t_end:
            if self.p.poll() is not None:
                break
            if wait_health and self.health():
                self.started = True
                break
            time.sleep(0.1)
        else:
            self.hung = True

    def health(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=2) as r:
                return r.status == 200
        except Exception:
            return False

    def request(self, path, body, timeout=120):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path),
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()

    def get(self, path, timeout=30):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path),
                                    timeout=timeout) as r:
            return json.loads(r.read().decode())

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(timeout=30)
            except Exception:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        return self.p.returncode


def warning_lines(text):
    return [l for l in text.splitlines() if " WARN " in l and "GPU-only" in l]


counts = {"passed": 0, "failed": 0}


def check(name, cond, detail=""):
    if cond:
        counts["passed"] += 1
        print("ok   " + name)
    else:
        counts["failed"] += 1
        print("FAIL " + name)
        if detail:
            print("    " + detail.strip().replace("\n", "\n    ")[-2500:])


def finish():
    print("%d passed, %d failed" % (counts["passed"], counts["failed"]))
    sys.exit(1 if counts["failed"] else 0)
