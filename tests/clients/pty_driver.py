"""Drive a program on a pseudo-terminal the way a person at a keyboard would.

Stdlib only (pty + select), so the REPL tests need nothing beyond the test suite's own deps.
The child is a session leader with the pty as its controlling terminal, so a typed Ctrl-C
reaches it as SIGINT through the terminal driver, exactly as at a real console.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import termios
import time

# CSI / OSC escape sequences and bare control bytes that prompt_toolkit paints with.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[=>()][0-9A-Za-z]?|[\x00-\x08\x0e-\x1f]"
)


class PtyProcess:
    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # child: exec at once, so no state of the (threaded) parent is used
            # ...except what exec keeps: the signal mask and ignored signals. A terminal's program
            # starts with neither, or a typed Ctrl-C would never reach it as SIGINT.
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGPIPE):
                signal.signal(signum, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        self.pid, self.fd = pid, fd
        # A real terminal has a size; prompt_toolkit lays out its line by it.
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.text = ""  # everything read so far, escape sequences removed
        self.pos = 0  # expect() searches from here on
        self.status: int | None = None

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        if not chunk:
            return False
        self.text += _ANSI.sub("", chunk.decode("utf-8", "replace")).replace("\r", "")
        return True

    def expect(self, pattern: str, timeout: float = 15.0) -> re.Match[str]:
        """Wait until `pattern` (a regex) appears in output after the previous match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            m = regex.search(self.text, self.pos)
            if m:
                self.pos = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.1)):
                m = regex.search(self.text, self.pos)
                if m:
                    self.pos = m.end()
                    return m
                tail = self.text[self.pos :][-2000:]
                raise AssertionError(f"{pattern!r} not seen; output since last match:\n{tail}")

    def send(self, data: str) -> None:
        os.write(self.fd, data.encode())

    def sendline(self, line: str) -> None:
        self.send(line + "\r")  # Enter on a terminal sends CR

    def wait(self, timeout: float = 15.0) -> int:
        """Exit status of the child (drains output so it never blocks on a full pty)."""
        deadline = time.monotonic() + timeout
        while self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                self.close()
                raise AssertionError("process did not exit")
            self._read(0.05)
        return self.status

    def close(self) -> None:
        if self.fd < 0:
            return
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except ProcessLookupError:
                pass
            self.status = -9
        os.close(self.fd)
        self.fd = -1
