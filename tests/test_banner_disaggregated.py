"""The start-up banner of a prefill/decode cluster names how KV moves (it once read an attribute
the cluster does not have and failed every disaggregated run from the command line)."""

from servelab.api import compose
from servelab.run.session import run_job


def test_disaggregated_banner_says_how_kv_moves(tmp_path, capsys):
    cfg = compose(["backend=sim", "model=llama3_8b", "hardware=h100", "cluster.prefill_replicas=1",
                   "cluster.decode_replicas=1", "workload.num_requests=4"], logger="none", progress=False)
    run_job(cfg, tmp_path, banner=True)
    assert "KV moves over intra_node links, overlapped with prefill" in capsys.readouterr().out
