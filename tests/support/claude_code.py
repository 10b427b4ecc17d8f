"""Claude Code (npm @anthropic-ai/claude-code, tests/e2e/clients) run the way a person runs it.

Each instance has its own HOME and project folder, so nothing touches the machine's
own Claude Code configuration, and an environment without API keys, telemetry,
error reporting or the auto-updater: ``claude mcp add/list/get/login`` needs none of
them (with these switches it connects to nothing but the MCP server: checked once
by hand with strace; without them it makes DNS look-ups).
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from npm_clients import CLAUDE, pinned, require

QUIET = {
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
PRESS_BUTTON = Path(__file__).with_name("press_button.py")


@dataclass
class ClaudeCode:
    home: Path
    project: Path

    @classmethod
    def in_dir(cls, root: Path) -> ClaudeCode:
        require(CLAUDE, pinned("@anthropic-ai/claude-code") + " ")
        (root / "home").mkdir(parents=True)
        (root / "project").mkdir()
        return cls(root / "home", root / "project")

    def env(self, **extra: str) -> dict[str, str]:
        kept = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ANTHROPIC_", "CLAUDE_", "MCP_")) and k != "BROWSER"
        }
        return {**kept, "HOME": str(self.home), "TERM": "xterm-256color", **QUIET, **extra}

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CLAUDE), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            cwd=self.project,
            env=self.env(),
            stdin=subprocess.DEVNULL,
        )

    def login(self, name: str, press_log: Path, timeout: float = 60) -> tuple[int, str]:
        """``claude mcp login NAME`` in a terminal (it refuses to run without one), with
        $BROWSER set to a "person" who presses the sign-in button (press_button.py)."""
        browser = self.home / "browser.sh"
        browser.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{PRESS_BUTTON}" "$1"\n')
        browser.chmod(0o755)
        env = self.env(BROWSER=str(browser), PRESS_BUTTON_LOG=str(press_log))
        return run_in_terminal([str(CLAUDE), "mcp", "login", name], self.project, env, timeout)


def run_in_terminal(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal; its exit code and everything it printed."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True
    )
    os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the terminal closed with the process
                    chunk = b""
                if not chunk and process.poll() is not None:
                    break
                output += chunk
            elif process.poll() is not None:
                break
        else:
            process.kill()
            process.wait()
            text = output.decode(errors="replace")
            raise AssertionError(f"{argv} did not finish in {timeout} s:\n{text}")
        return process.wait(timeout=10), output.decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
