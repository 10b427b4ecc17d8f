"""What `serve` does about the default sandbox image, against the real Docker engine.

Seen: on a machine that had never built the images, `check` and /health said ok and
the first create_experiment answered IMAGE_MISSING.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from structlog.testing import capture_logs

from app.ops.base_images import ImageBuildFailed, ensure_default_image, how_to_build
from app.settings import RuntimeSettings, load_settings

pytestmark = pytest.mark.integration


@pytest.fixture
def absent_image() -> Iterator[str]:
    """A tag no engine has; removed again if a test built it."""
    name = f"sandbox-mcp/test-absent-{uuid.uuid4().hex[:8]}:1"
    yield name
    client = docker.from_env()
    try:
        if client.images.list(name=name):
            client.images.remove(name)
    finally:
        client.close()


def settings_with_default(image: str, monkeypatch: pytest.MonkeyPatch) -> RuntimeSettings:
    monkeypatch.setenv("SANDBOX_MCP_IMAGES", f"sandbox-mcp/python:3,{image}")
    monkeypatch.setenv("SANDBOX_MCP_DEFAULT_IMAGE", image)
    return load_settings().runtime


def fake_build_script(folder: Path) -> Path:
    """Stands in for deploy/build-base-image: records its argument, makes the image by
    tagging one that exists, and takes a moment, as a real build does."""
    script = folder / "build-base-image"
    script.write_text(
        '#!/bin/sh\nset -e\necho "$1" >"$0.args"\n'
        'echo "[build-base-image] building" >&2\n'
        'docker tag sandbox-mcp/python:3 "$BUILD_AS"\n'
    )
    script.chmod(0o755)
    return script


async def test_a_missing_default_image_is_reported_not_built_unasked(
    absent_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_with_default(absent_image, monkeypatch)
    with capture_logs() as logs:
        status = await ensure_default_image(settings, build=False)
    assert status.images is not None
    assert (status.images.ready, status.images.missing) == (
        ("sandbox-mcp/python:3",),
        (absent_image,),
    )
    assert not status.can_run_experiments
    [warning] = [e for e in logs if e["event"] == "images.default_missing"]
    assert warning["image"] == absent_image
    assert warning["todo"] == how_to_build(absent_image)
    assert not [e for e in logs if e["event"] == "images.building"]


async def test_build_images_builds_the_missing_default_and_says_how_long(
    absent_image: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = settings_with_default(absent_image, monkeypatch)
    script = fake_build_script(tmp_path)
    monkeypatch.setenv("BUILD_AS", absent_image)
    with capture_logs() as logs:
        status = await ensure_default_image(
            settings, build=True, script=script, targets={absent_image: "python"}
        )
    assert script.with_name("build-base-image.args").read_text() == "python\n"
    assert status.can_run_experiments, status
    events = [e["event"] for e in logs]
    assert events[-2:] == ["images.building", "images.built"]
    building, built = logs[-2:]
    assert building["command"] == f"{script} python"
    assert "minutes the first time" in building["expect"]
    assert built["seconds"] >= 0


async def test_build_images_refuses_an_image_the_script_does_not_make(
    absent_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_with_default(absent_image, monkeypatch)
    with pytest.raises(ImageBuildFailed) as caught:
        await ensure_default_image(settings, build=True)
    assert caught.value.message == (
        f"Cannot build the default image: {absent_image} is not one of "
        "deploy/build-base-image's images: build or pull it under that tag, or choose "
        "another SANDBOX_MCP_DEFAULT_IMAGE."
    )


async def test_a_failed_build_says_so_and_what_to_do(
    absent_image: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = settings_with_default(absent_image, monkeypatch)
    script = tmp_path / "build-base-image"
    script.write_text("#!/bin/sh\necho 'debootstrap not found' >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(ImageBuildFailed) as caught:
        await ensure_default_image(
            settings, build=True, script=script, targets={absent_image: "python"}
        )
    assert caught.value.message.startswith(f"{script} python failed (exit 3, after ")


def test_the_sentence_names_the_script_s_argument_for_its_own_images() -> None:
    assert how_to_build("sandbox-mcp/node:22").startswith(
        "build it with `sudo deploy/build-base-image node22`"
    )


async def test_build_images_with_the_default_built_builds_nothing(tmp_path: Path) -> None:
    never = tmp_path / "must-not-run"
    never.write_text('#!/bin/sh\ntouch "$0.ran"\nexit 1\n')
    never.chmod(0o755)
    with capture_logs() as logs:
        status = await ensure_default_image(load_settings().runtime, build=True, script=never)
    assert status.can_run_experiments
    assert not never.with_name("must-not-run.ran").exists()
    [ready] = [e for e in logs if e["event"] == "images.ready"]
    assert "sandbox-mcp/python:3" in ready["ready"]
