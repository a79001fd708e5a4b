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
    prefetch = {r["label"]: r for r in res["prefetch"]}
    early, plain = prefetch["write_back_prefetch 1 GB/s"], prefetch["write_back 1 GB/s"]
    assert plain["prefetch_blocks"] == 0 and early["prefill_tokens"] == plain["prefill_tokens"]
    assert len(res["selective"]) == 3 and len(res["chat_tp8"]) == len(res["mooncake_tp4"]) == 2
    gpu, host = res["tiers"][:2]
    assert host["prefill_tokens"] <= gpu["prefill_tokens"]
    text = study.page(res, 1.0, "python experiments/kv_tiers/study.py")
    findings = text.split("## Findings")[1].split("##")[0]
    assert len(re.findall(r"\d+\.\d", findings)) >= 5
