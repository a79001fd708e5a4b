"""Output that never misleads, your own checkpoint without traps, Python from the repository root
(issue 22, items 3-5)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import REPO, compose
from servelab.core.errors import ConfigError, ServelabError
from servelab.core.request import Request
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack
from servelab.assemble.validate import validate
from servelab.kit.testing import FakeExecutor, VirtualClock

_MISSING = object()
_STATED = re.compile(r"(?<![\w./=-])([a-z_]+(?:\.[a-z_]+)*)=([^\s,;()]+)")


def _config_value(cfg, key: str):
    """What the composed ``cfg`` says for ``key`` as a line would state it (``scheduler=fcfs``: the
    group option's name; a bare field of one group, ``prefix_caching``: that group's)."""
    node = OmegaConf.select(cfg, key, default=_MISSING)
    if node is _MISSING and "." not in key:
        owners = [g for g in cfg if OmegaConf.is_dict(cfg[g]) and key in cfg[g]]
        node = cfg[owners[0]][key] if len(owners) == 1 else _MISSING
    if OmegaConf.is_dict(node) and "name" in node:
        node = node.name
    if node is _MISSING:
        return node
    node = getattr(node, "value", node)
    return "null" if node is None else str(node).lower() if isinstance(node, bool) else str(node)


def test_the_default_runs_start_up_states_only_settings_it_has(tmp_path, caplog, capsys):
    """Every ``key=value`` the default stack's start-up prints (logs, banner) is what the composed
    config says: no ``model.quantization=int8`` line in a run without quantisation."""
    from servelab.api import compose as api_compose

    cfg = api_compose(["workload.num_requests=2", "workload.max_tokens=4"], logger="none", progress=False)
    assert cfg.model.name == "tiny_code" and cfg.workload.name == "corpus"  # the default stack
    with caplog.at_level(logging.INFO):
        result = run_job(cfg, tmp_path, banner=True)
    assert result.summary["num_finished"] == 2
    printed = capsys.readouterr().out
    text = printed + "\n" + "\n".join(r.getMessage() for r in caplog.records)
    stated = _STATED.findall(text)
    assert ("scheduler", "fcfs") in stated and ("clock", "auto") in stated  # the banner's stack line
    wrong = [(k, v, _config_value(cfg, k)) for k, v in stated if _config_value(cfg, k) != v]
    assert not wrong, f"lines state settings the run does not have (key, stated, config): {wrong}"
    assert "quantization" not in text and "dequantised" not in text


def test_a_path_less_file_workload_is_one_line_naming_the_key():
    for workload in ("jsonl", "prompts"):
        with pytest.raises(ConfigError) as err:
            validate(compose(f"workload={workload}"))
        assert str(err.value) == f"workload={workload} needs workload.path: add workload.path=<file>"
    with pytest.raises(ConfigError, match=r"^model=hf needs model.path: add model.path=<checkpoint dir>$"):
        validate(compose("model=hf"))


def test_a_path_less_workload_on_the_command_line_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), "model=tiny", "workload=jsonl", "logger=none",
                           f"hydra.run.dir={tmp_path}"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("servelab: error: workload=jsonl needs workload.path: "
                                                    "add workload.path=<file>")
    assert "Traceback" not in proc.stderr


def test_an_empty_text_prompt_is_rejected_and_the_others_finish(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"id": "empty", "prompt": "", "max_tokens": 4}\n{"id": "ok", "prompt": "def f(x):", '
                    '"max_tokens": 4}\n')
    cfg = compose("model=tiny_code", "workload=jsonl", f"workload.path={path}", "backend.num_threads=1")
    result = run_job(cfg, tmp_path / "out")
    by_id = result.by_id()
    assert by_id["empty"]["rejected_reason"] == "empty prompt" and by_id["empty"]["prompt_len"] == 0
    assert by_id["ok"]["finish_reason"] in ("length", "stop") and result.summary["num_finished"] == 1


def test_eval_ppl_window_zero_is_an_error_not_the_default():
    from servelab.cli.eval_ppl import _window
    from servelab.core.packaged import PACKAGED_CHECKPOINTS

    path = str(PACKAGED_CHECKPOINTS / "tiny_code")
    with pytest.raises(ConfigError, match=r"^eval_ppl.window=0 must be between 2 and the model's context \(512"):
        _window(compose("model=tiny_code", "eval_ppl.window=0"), path)
    assert _window(compose("model=tiny_code"), path) == 512  # null: the context


def _fake_run(tmp_path, requests, *overrides, num_kv_blocks):
    cfg = compose(*overrides, f"num_kv_blocks={num_kv_blocks}")
    clock = VirtualClock()
    stack = build_stack(cfg, executor=FakeExecutor(clock, num_kv_blocks), clock=clock)
    return run_job(cfg, tmp_path, requests, stack)


def test_a_kv_pool_smaller_than_every_request_fails_at_start_up(tmp_path):
    requests = [Request(f"r{i}", tuple(range(1, 9 + i)), 4) for i in range(3)]  # 12..14 tokens: 3-4 blocks of 4
    with pytest.raises(ConfigError) as err:
        _fake_run(tmp_path, requests, "block_size=4", num_kv_blocks=2)
    assert str(err.value) == ("num_kv_blocks=2 holds no request of this workload: the smallest ('r0': 12 tokens "
                              "with its output) needs at least 3 blocks of 4; set num_kv_blocks>=3")
    assert not (tmp_path / "summary.json").exists()  # nothing ran
    # one request that fits is enough: the others are rejected as they arrive, as before
    summary = _fake_run(tmp_path, requests, "block_size=4", num_kv_blocks=3).summary
    assert summary["num_finished"] == 1 and summary["num_rejected"] == 2


def test_tokens_per_verify_is_explained_beside_the_steps_saved(capsys):
    from servelab.results.metrics import RequestStats
    from servelab.results.report import print_summary

    def rec(rid, output_len, drafted, kept, verifies):
        return {"id": rid, "output_len": output_len, "rejected_reason": None, "prompt_len": 4,
                "num_cached_prompt_tokens": 0, "met_slo": None, "met_ttft_slo": None, "met_tpot_slo": None,
                "finish_reason": "length", "ttft_ms": 1.0, "e2e_ms": 2.0, "queue_ms": 0.0, "tpot_ms": 1.0,
                "itl_ms": [], "num_draft_tokens": drafted, "num_accepted_tokens": kept, "num_verify_steps": verifies,
                "spec_drafted_by_position": [verifies], "spec_accepted_by_position": [kept]}

    # drafts rarely (2 verify steps, both kept 4): 5 tokens per verify, 8 of 100 passes saved;
    # drafts always (50 verify steps keeping 1 of 2): 2 per verify, but 50 of 100 passes saved
    rare = RequestStats.of([rec("a", 100, 8, 8, 2)]).speculation()
    often = RequestStats.of([rec("b", 100, 100, 50, 50)]).speculation()
    assert rare["spec_mean_tokens_per_verify"] == 5.0 > often["spec_mean_tokens_per_verify"] == 2.0
    assert rare["spec_steps_saved_fraction"] == 0.08 < often["spec_steps_saved_fraction"] == 0.5
    from rich.console import Console

    print_summary({"status": "completed", "spec_acceptance_rate": 0.5, **often}, "out", Console(width=200))
    out = capsys.readouterr().out
    assert "spec_mean_tokens_per_verify (verify steps only)" in out
    assert "spec_steps_saved_fraction (drafted tokens kept / output tokens)" in out
    doc = (REPO / "docs" / "metrics.md").read_text()
    assert "`spec_steps_saved_fraction` ranks them" in doc and "drafts less often" in doc


def test_help_shows_the_values_the_default_run_uses():
    from servelab.cli.help import help_text

    text = help_text([])
    assert "  max_model_len: int = 512  (schema default 2048)" in text.splitlines()
    assert "model  (default: tiny_code)" in text
    this_run = next(line for line in text.splitlines() if line.startswith("  this run (model=tiny_code)"))
    assert "max_position_embeddings=512" in this_run and "hidden_size=192" in this_run  # its config.json
    assert "  this run (backend=torch): num_threads=1" in text.splitlines()
    tiny = help_text(["model=tiny"])
    assert "  max_model_len: int = 2048" in tiny.splitlines() and "model  (this run: tiny)" in tiny


def test_own_checkpoint_under_the_shipped_model_group_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate(compose("model=tiny_code", f"model.path={tmp_path}"))
    assert str(err.value) == (f"model.path={tmp_path} with model=tiny_code: model=tiny_code is the shipped checkpoint "
                              "(its name, max_model_len and backend.num_threads); for your own checkpoint use "
                              f"model=hf model.path={tmp_path}")
    validate(compose("model=tiny_code"))  # the shipped path itself is fine


def test_own_checkpoint_without_a_tokenizer_names_the_way_out(tmp_path, checkpoint_dir):
    path = checkpoint_dir("llama_gqa_untied")
    cfg = compose("model=hf", f"model.path={path}", "workload=corpus", "workload.num_requests=2")
    with pytest.raises(ServelabError) as err:
        run_job(cfg, tmp_path)
    assert str(err.value) == (f"workload=corpus: a text prompt needs a tokenizer, but the checkpoint model=hf ({path}) "
                              "has none; run token ids instead: workload=synthetic, or workload=jsonl with "
                              "prompt_token_ids")
    doc = " ".join((REPO / "docs" / "configuration.md").read_text().split())
    assert "`run token ids instead: workload=synthetic, or workload=jsonl with prompt_token_ids`" in doc


def test_catalogue_context_is_the_models_positions_and_longer_is_capped_in_one_line(tmp_path, caplog):
    assert compose("backend=sim", "model=llama2_70b").max_model_len == 4096
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:46.{i:06d},{n},20\n" for i, n in enumerate((100, 6000, 9000, 300))))
    cfg = compose("backend=sim", "model=llama2_70b", "hardware=a100_80gb", "tensor_parallel_size=4",
                  "max_model_len=16384", "workload=trace", f"workload.path={trace}")
    with caplog.at_level(logging.INFO):
        summary = run_job(cfg, tmp_path / "out").summary
    lines = [r.getMessage() for r in caplog.records]
    assert "max_model_len=16384 capped to the model's max_position_embeddings=4096" in lines
    assert any("2 requests clipped to max_model_len=4096" in line for line in lines), lines
    assert summary["num_finished"] == 4 and summary["num_rejected"] == 0


ROOT_IMPORT = """
import importlib.machinery, importlib.util, os, sys
import transformers
from transformers import AutoConfig
from transformers.utils import is_kernels_available
root = os.path.abspath(os.curdir)
hub = importlib.machinery.PathFinder.find_spec("kernels", [p for p in sys.path if os.path.abspath(p or os.curdir) != root])
import kernels
if hub is not None and hub.origin is not None:  # the hub package is installed (transformers >= 5.25 requires it)
    assert is_kernels_available() is True and kernels.__file__ == hub.origin, kernels.__file__
else:  # none: the folder stands aside and the probe sees nothing
    assert is_kernels_available() is False and kernels.__file__ is None and list(kernels.__path__) == []
import servelab.kernels
assert servelab.kernels.select_attention_backend and 'servelab.kernels.backend' in sys.modules
print('ok')
"""


def test_transformers_imports_from_the_repository_root():
    """The repository's kernels/ folder is found as a top-level `kernels` from the root (sys.path[0]
    is ''); it stands aside, so transformers' probe for the hub package sees none, or the hub package
    itself where one is installed (transformers 5.25 depends on it)."""
    proc = subprocess.run([sys.executable, "-c", ROOT_IMPORT], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_hub_kernels_package_wins_over_the_folder(tmp_path):
    hub = tmp_path / "site" / "kernels"
    hub.mkdir(parents=True)
    (hub / "__init__.py").write_text('__version__ = "0.9.0"\n')
    proc = subprocess.run([sys.executable, "-c", "import kernels; print(kernels.__version__, kernels.__file__)"],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    assert proc.stdout.split() == ["0.9.0", str(hub / "__init__.py")], proc.stderr[-2000:]


def _python_api_example() -> str:
    text = (REPO / "docs" / "python-api.md").read_text()
    return re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)


@pytest.mark.slow
def test_the_python_api_example_runs_from_the_repository_root(tmp_path):
    """docs/python-api.md's example, as a script run from the root (its last lines write a run: a
    scratch folder instead of outputs/api, and 16 requests of the default workload)."""
    code = _python_api_example().replace('"outputs/api"', repr(str(tmp_path / "api")))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "api" / "summary.json").read_text())["num_finished"] == 16
