"""The plugin of docs/write-a-time-model.md registers, composes as ``time_model=linear`` and prices
steps as the page says, in the simulator and on the real engine's virtual clock."""

import pytest

from doc_plugins import page_code_blocks, register_page_plugin
from servelab.api import compose
from servelab.core.request import Request
from servelab.assemble.stack import build_stack

@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    code = page_code_blocks("write-a-time-model.md")[1]  # the complete example
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), "doc_linear_time")


@pytest.mark.parametrize("backend", [["backend=sim", "model=llama3_8b"],
                                     ["clock=virtual", "model=tiny", "model.hidden_size=32", "model.intermediate_size=64",
                                      "model.num_hidden_layers=1", "model.num_attention_heads=2",
                                      "model.num_key_value_heads=1"]])
def test_the_pages_time_model_prices_each_step(registry, backend):
    cfg = compose([*backend, "time_model=linear", "time_model.per_token_us=80"], logger="none", progress=False)
    engine = build_stack(cfg, registry).engine
    engine.add_request(Request("a", tuple(range(1, 101)), max_tokens=3))
    prefill, decode = engine.step(), engine.step()
    assert prefill.duration_s == pytest.approx(500e-6 + 100 * 80e-6 + 100 * 20e-9)
    assert decode.duration_s == pytest.approx(500e-6 + 1 * 80e-6 + 101 * 20e-9)
    assert engine.now() == pytest.approx(prefill.duration_s + decode.duration_s)
