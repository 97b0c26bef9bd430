"""A TrainingRun started from the Temporal Web UI's "Start Workflow" form, in a real browser.

The dev server's Web UI has Start Workflow enabled: ``temporal server start-dev`` builds the UI
server's config without setting ``StartWorkflowDisabled`` (false), so no flag is needed; the
test checks ``/api/v1/settings`` first so that a UI that turns it off fails with that reason.

The browser is Chromium from the system (Playwright cannot download one offline):
``/usr/bin/chromium`` (``apt-get install -y chromium``, as ``.ci/run`` does) or ``CAIRN_CHROMIUM``.
Screenshots go to ``CAIRN_TEST_ARTIFACTS/test_web_ui/`` when that is set, else to the test's
``tmp_path/artifacts/``; never into the checkout.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright
from playwright.async_api import expect as page_expect
from temporalio.client import Client, WorkflowExecutionStatus

from activities.views import RunSummary
from cairn.config import TrainConfig
from tests.conftest import REPO
from tests.integration.conftest import assert_matches_reference
from workers.client import connect
from workers.stack.servers import ServerProcess, free_port, temporal_command, wait_for_http, wait_for_temporal
from workers.worker import serving

pytestmark = pytest.mark.integration

NAMESPACE = "default"
TOTAL_STEPS = 20
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these Chromium phones home at start, which a closed network refuses.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STARTS = 3
"""How many times the dev server is started with fresh ports before the fixture gives up."""
UI_TIMEOUT_MS = 20_000
"""How long one browser step (a page load, an element appearing) may take: generous, as the suite
shares two cores with servers and workers. ``expect`` does not read the page's default: pass it."""


def chromium_executable() -> str:
    """The system's Chromium, or a skip that says how to install it."""
    configured = os.environ.get("CAIRN_CHROMIUM")
    if configured:
        if not Path(configured).is_file():
            pytest.fail(f"CAIRN_CHROMIUM={configured} is not a file")
        return configured
    found = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None)
    if found is None:
        pytest.skip(
            "no Chromium for the Web UI test: apt-get install -y chromium (as .ci/run does), "
            "or set CAIRN_CHROMIUM to a Chromium/Chrome binary"
        )
    return found


@dataclass(frozen=True)
class TemporalWithUI:
    address: str
    ui_url: str
    process: ServerProcess


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_executable()


@pytest.fixture(scope="module")
def temporal_with_ui(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TemporalWithUI]:
    """This module's own dev server, with the Web UI on a free port (the session's is headless)."""
    root = tmp_path_factory.mktemp("temporal-ui")
    for attempt in range(1, STARTS + 1):
        # A port free_port() saw free can be taken before the server binds it (the server picks
        # its internal ports the same way): the server then exits, and we retry with new ports.
        port, ui_port = free_port(), free_port()
        argv = temporal_command(port, ui_port, root / f"temporal-{attempt}.db")
        server = ServerProcess("temporal", argv, root / f"temporal-{attempt}.log").start()
        try:
            wait_for_temporal("127.0.0.1", port, timeout=60, alive=server.alive)
            wait_for_http(f"http://127.0.0.1:{ui_port}/", timeout=60, alive=server.alive)
        except RuntimeError:
            server.stop()
            if attempt == STARTS:
                pytest.fail(f"the Temporal dev server did not start {STARTS} times; last log:\n{server.log_tail()}")
            continue
        except Exception:
            server.stop()
            print(server.log_tail())
            raise
        break
    try:
        yield TemporalWithUI(address=f"127.0.0.1:{port}", ui_url=f"http://127.0.0.1:{ui_port}", process=server)
    finally:
        server.stop(grace=5.0)


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """Where screenshots go: ``CAIRN_TEST_ARTIFACTS`` (kept, e.g. for CI to upload) or tmp_path."""
    configured = os.environ.get("CAIRN_TEST_ARTIFACTS")
    folder = Path(configured) / "test_web_ui" if configured else tmp_path / "artifacts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
async def ui_client(temporal_with_ui: TemporalWithUI) -> Client:
    return await connect(temporal_with_ui.address)


def ui_settings(ui_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{ui_url}/api/v1/settings", timeout=5) as response:
        return dict(json.loads(response.read()))


async def page_text(page: Page, limit: int = 4000) -> str:
    try:
        text = await page.locator("body").inner_text(timeout=2000)
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not hide the real failure
        return f"<page text unavailable: {exc}>"
    return " ".join(text.split())[:limit]


@asynccontextmanager
async def browser_page(executable: str, profile: Path, artifacts: Path, name: str) -> AsyncIterator[Page]:
    """A headless Chromium page with a fresh profile. On any failure inside the block the page is
    screenshotted to ``artifacts/NAME-failure.png`` and its URL and text are added to the error."""
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(profile), executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = context.pages[0] if context.pages else await context.new_page()
            page.set_default_timeout(UI_TIMEOUT_MS)
            try:
                yield page
            except Exception as exc:
                shot = artifacts / f"{name}-failure.png"
                try:
                    await page.screenshot(path=str(shot), full_page=True)
                except Exception as shot_exc:  # noqa: BLE001
                    shot = Path(f"<no screenshot: {shot_exc}>")
                exc.add_note(f"browser at {page.url}; screenshot {shot}\npage text: {await page_text(page)}")
                raise
        finally:
            await context.close()


async def start_from_web_ui(page: Page, ui_url: str, workflow_id: str, task_queue: str, run_json: str) -> None:
    """What a user does: Workflows page -> Start Workflow -> fill the form -> Start Workflow."""
    await page.goto(f"{ui_url}/namespaces/{NAMESPACE}/workflows")
    await page.get_by_role("link", name="Start Workflow").click()
    await page.wait_for_url("**/workflows/start-workflow**")
    heading = page.get_by_role("heading", name="Start Workflow", level=1)
    await page_expect(heading).to_be_visible(timeout=UI_TIMEOUT_MS)

    await page.get_by_role("textbox", name="Workflow ID").fill(workflow_id)
    await page.get_by_role("textbox", name="Task Queue").fill(task_queue)
    await page.get_by_role("textbox", name="Workflow Type").fill("TrainingRun")
    data = page.get_by_role("textbox", name="Data")  # a CodeMirror editor (contenteditable)
    await data.fill(run_json)
    await page.get_by_role("radio", name="json/plain").check()
    # Leaving the editor pretty-prints its JSON and the form grows: do it before aiming at the
    # button, or the click's mousedown moves the button away from under its mouseup.
    await heading.click()
    typed = await data.inner_text()
    assert json.loads(typed) == json.loads(run_json), typed
    # The form asks the server who polls the task queue: our in-process worker.
    active = page.get_by_role("status").filter(has_text="Task Queue is Active")
    await page_expect(active).to_be_visible(timeout=UI_TIMEOUT_MS)

    submit = page.get_by_role("button", name="Start Workflow")
    await page_expect(submit).to_be_enabled(timeout=UI_TIMEOUT_MS)
    async with page.expect_response(
        lambda r: r.request.method == "POST" and f"/workflows/{workflow_id}" in r.url
    ) as started:
        await submit.click()
    response = await started.value
    assert response.ok, f"the UI's start request failed: {response.status} {await response.text()}"


async def test_run_started_from_web_ui_completes_bit_identical(
    chromium: str, temporal_with_ui: TemporalWithUI, ui_client: Client, task_queue: str, tmp_path: Path, artifacts: Path
) -> None:
    settings = ui_settings(temporal_with_ui.ui_url)
    assert settings.get("StartWorkflowDisabled") is False, f"the dev server's UI disables Start Workflow: {settings}"
    assert not settings.get("DisableWriteActions"), settings

    example = json.loads((REPO / "examples" / "run.json").read_text())
    example["store"] = str(tmp_path / "store")  # never the example's s3://cairn/runs
    example["total_steps"] = TOTAL_STEPS
    workflow_id = f"web-ui-{uuid.uuid4().hex[:8]}"

    async with (
        serving(ui_client, task_queue),
        browser_page(chromium, tmp_path / "chromium-profile", artifacts, workflow_id) as page,
    ):
        await start_from_web_ui(page, temporal_with_ui.ui_url, workflow_id, task_queue, json.dumps(example, indent=2))
        handle = ui_client.get_workflow_handle(workflow_id)
        result = await asyncio.wait_for(handle.result(), timeout=60)
        described = await handle.describe()

        # The finished run, as the UI shows it.
        await page.goto(f"{temporal_with_ui.ui_url}/namespaces/{NAMESPACE}/workflows/{workflow_id}/{described.run_id}")
        await page_expect(page.get_by_role("heading", level=1)).to_contain_text(workflow_id, timeout=UI_TIMEOUT_MS)
        # The status badge (CSS shows it uppercase; its text is "Completed").
        badge = page.get_by_role("status").filter(has_text=re.compile(r"^\s*Completed\s*$"))
        await page_expect(badge).to_be_visible(timeout=UI_TIMEOUT_MS)
        await page_expect(page.get_by_role("link", name="TrainingRun")).to_be_visible(timeout=UI_TIMEOUT_MS)
        await page_expect(page.get_by_role("link", name=task_queue)).to_be_visible(timeout=UI_TIMEOUT_MS)
        shot = artifacts / f"{workflow_id}-completed.png"
        await page.screenshot(path=str(shot), full_page=True)
        text = await page_text(page)

    assert described.workflow_type == "TrainingRun" and described.task_queue == task_queue, described
    assert described.status == WorkflowExecutionStatus.COMPLETED, described.status
    assert "COMPLETED" in text.upper() and "TrainingRun" in text and workflow_id in text, text
    assert shot.stat().st_size > 0
    summary = RunSummary.model_validate(result)
    assert summary.steps == TOTAL_STEPS and summary.run_id == example["run_id"], summary
    assert_matches_reference(summary, TrainConfig.model_validate(example["config"]))
