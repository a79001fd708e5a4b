"""experiments/kv_tiers/study.py: the study runs end to end (small) and its page states findings with numbers."""

from __future__ import annotations

import importlib.util
import re

from conftest import REPO


def test_the_study_runs_and_writes_findings_with_numbers():
    spec = importlib.util.spec_from_file_location("kv_tiers_study", REPO / "experiments" / "kv_tiers" / "study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    res = study.study(sessions=16, num_kv_blocks=1200)
    assert [r["label"] for r in res["policies"]] == ["none", "write_back", "write_through", "reuse_aware"]
    gpu, host = res["tiers"][:2]
    assert host["prefill_tokens"] <= gpu["prefill_tokens"]
    text = study.page(res, 1.0, "python experiments/kv_tiers/study.py")
    findings = text.split("## Findings")[1].split("##")[0]
    assert len(re.findall(r"\d+\.\d", findings)) >= 5
