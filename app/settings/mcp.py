"""The tool layer: how long a call waits in the queue, how often it reports progress, the
calls one sandbox has in flight, the MCP tasks kept, the caps on listen streams, and the
worker threads of tenants' calls, and the MCP Apps view."""

from __future__ import annotations

from pydantic import Field, model_validator

from app.settings.base import Group
from app.tenancy.calls_in_flight import DEFAULT_PER_ADDRESS as DEFAULT_CALLS_PER_ADDRESS
from app.tenancy.calls_in_flight import DEFAULT_PER_SANDBOX as DEFAULT_CALLS_PER_SANDBOX
from app.tenancy.threads import DEFAULT_PER_ADDRESS, DEFAULT_PER_SANDBOX, DEFAULT_TOTAL


class McpSettings(Group):
    queue_wait_s: float = Field(
        default=20,
        ge=0,
        le=50,
        description=(
            "How long a call waits in the queue (sending progress) before it returns its "
            "position; MCP clients give up after about 60 s."
        ),
    )
    progress_interval_s: float = Field(
        default=15,
        ge=1,
        le=30,
        description=(
            "How often a long call (a synchronous command, a wait for a job's result) tells "
            "a client that asked for progress that it is alive."
        ),
    )
    max_calls_per_sandbox: int = Field(
        default=DEFAULT_CALLS_PER_SANDBOX,
        ge=1,
        le=10_000,
        description=(
            "Tool calls one sandbox has in flight at once (waiting ones and MCP tasks "
            "included); the one past it is refused at once with TOO_MANY_CALLS, so one "
            "tenant's waiting calls cannot hold every connection the server accepts."
        ),
    )
    max_calls_per_address: int = Field(
        default=DEFAULT_CALLS_PER_ADDRESS,
        ge=1,
        le=100_000,
        description=(
            "Tool calls the sandboxes signed in from one address (hosted mode) have in "
            "flight together; the one past it is refused at once with TOO_MANY_CALLS."
        ),
    )
    task_keep_s: int = Field(
        default=3600,
        ge=60,
        le=86_400,
        description=(
            "How long a finished MCP task (its final result) is kept for tasks/get; then it "
            "reads as unknown (its command's job stays in the records)."
        ),
    )
    max_tasks_per_sandbox: int = Field(
        default=20,
        ge=1,
        le=1000,
        description=(
            "MCP tasks one sandbox holds, running and finished; a new one forgets the "
            "sandbox's oldest finished task, and a call finding them all running is served "
            "without a task."
        ),
    )
    max_tasks: int = Field(
        default=2000,
        ge=1,
        le=100_000,
        description=(
            "MCP tasks the server holds in memory, all sandboxes together; at it a new task "
            "forgets the oldest finished task of the sandbox holding the most (if more than "
            "the caller would), else the call is served without a task."
        ),
    )
    max_listen_streams_per_sandbox: int = Field(
        default=4,
        ge=1,
        le=1000,
        description=(
            "Open subscriptions/listen streams per sandbox (Claude Code holds one per "
            "running client); past it the new one is refused with TOO_MANY_LISTEN_STREAMS."
        ),
    )
    max_listen_streams: int = Field(
        default=1024,
        ge=1,
        le=100_000,
        description="Open subscriptions/listen streams, all sandboxes together.",
    )
    threads_per_sandbox: int = Field(
        default=DEFAULT_PER_SANDBOX,
        ge=1,
        le=64,
        description=(
            "Worker threads one sandbox's calls use at once (file reads, searches, listings, "
            "project maps, change reports, artifact copies); its further calls wait their "
            "turn, first come first served."
        ),
    )
    threads_per_address: int = Field(
        default=DEFAULT_PER_ADDRESS,
        ge=1,
        le=256,
        description=(
            "Worker threads the sandboxes signed in from one address (hosted mode) use "
            "together, so the sandboxes one address may hold cannot take every thread."
        ),
    )
    tenant_threads: int = Field(
        default=DEFAULT_TOTAL,
        ge=1,
        le=256,
        description=(
            "Worker threads of all sandboxes' calls together; the server's own upkeep has "
            "threads of its own, which no sandbox can take."
        ),
    )

    apps_view: bool = Field(
        default=True,
        description=(
            "Offer the MCP Apps view (the sandbox inline in claude.ai) to clients that "
            "declare the io.modelcontextprotocol/ui extension; off, no client sees it."
        ),
    )

    @model_validator(mode="after")
    def _share_fits(self) -> McpSettings:
        if not self.threads_per_sandbox <= self.threads_per_address <= self.tenant_threads:
            raise ValueError(
                "SANDBOX_MCP_THREADS_PER_SANDBOX must not exceed SANDBOX_MCP_THREADS_PER_ADDRESS, "
                "which must not exceed SANDBOX_MCP_TENANT_THREADS"
            )
        return self
