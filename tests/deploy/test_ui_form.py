"""The Prefect UI's run form of finetune/manual, opened in a real headless Chromium: it shows the config's
sections and fields with their descriptions, prefilled from the tiny-cpu preset. The screenshot is kept
in .tandem/artifacts/finetune-manual-form.png."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT = ROOT / ".tandem" / "artifacts" / "finetune-manual-form.png"
# Titles and descriptions the form must render (from config/schema.py and config/sections/), top to bottom.
EXPECTED = [
    "Parameters",
    "config",
    "A whole fine-tuning run: prepare, train, evaluate, register.",
    "Storage",
    "fsspec URL shared by every node",
    "Max Length",
    "Train",
    "Method",
    "Which parameters are trained.",
    "Learning Rate",
    "Peak learning rate.",
    "Launch",
    "Backend",
    "Nnodes",
]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (tools/install-test-services.sh installs it)")
def test_the_run_form_shows_the_config_fields(deployed) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.deploy.test_deployments import client_of

    with client_of(deployed) as client:
        deployment = client.read_deployment_by_name("finetune/manual")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 3000})
            page.goto(f"{deployed.ui_url}/deployments/deployment/{deployment.id}/run")
            expect(page.get_by_text("Learning Rate", exact=False).first).to_be_visible(timeout=60_000)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            text = page.inner_text("body")
            values = page.locator("input, textarea").evaluate_all("elements => elements.map(e => e.value)")
        finally:
            browser.close()
    positions = [text.find(expected) for expected in EXPECTED]
    missing = [expected for expected, at in zip(EXPECTED, positions, strict=True) if at < 0]
    assert not missing, f"the form does not show {missing}; page text:\n{text[:2000]}"
    assert "Can't connect to Server API" not in text
    assert "manual" in text and "tandem-pipeline" in text
    # Prefilled from the deployment's parameters (the tiny-cpu preset), not the schema's defaults (512, 0.0003).
    assert {"256", "0.003", "tiny"} <= set(values), values
