"""The rollout server's client (ablate.rollouts.server.VLLMServerGenerator) against a stand-in for vLLM's HTTP API, so
without vLLM: one /v1/completions request per group of identical prompts, carrying the first row's seed and n (vLLM
seeds the i-th completion with seed + i: the colocated engine's per-row seeds), the rows back in the trainer's order;
a server holding weights this run did not push, and one that stops answering, are one line each."""

from __future__ import annotations

import threading
import urllib.error
from types import SimpleNamespace

import pytest

from ablate.errors import PeerLostError
from ablate.rollouts.server import VLLMServerGenerator

ARGS = SimpleNamespace(temperature=0.8, top_p=1.0, top_k=0, max_completion_length=5, output_dir=None)


def _client(held: str | None = None) -> tuple[VLLMServerGenerator, list[dict]]:
    gen = VLLMServerGenerator(ARGS, tokenizer=None, url="http://127.0.0.1:9")
    gen.model_name, gen.session, gen.pushed = "m", "abc", 3
    posted: list[dict] = []
    lock = threading.Lock()

    def post(path: str, body: dict | None = None) -> dict:
        assert path == "/v1/completions"
        with lock:
            posted.append(body)
        n, seed = body["n"], body["seed"]
        choices = [
            {"index": i, "token_ids": [seed + i, 2], "logprobs": {"token_logprobs": [-0.1 * i, -0.2]}}
            for i in reversed(range(n))  # out of order: the client sorts by index
        ]
        return {"choices": choices}

    gen._post = post
    gen._get = lambda path: {"weight_version": held if held is not None else gen._weight_version(3)}
    return gen, posted


def test_one_request_per_group_with_its_first_rows_seed_and_the_rows_in_order():
    gen, posted = _client()
    prompts = [[1, 2]] * 3 + [[5]] * 2 + [[1, 2]]  # the last row repeats the first prompt, but apart
    out = gen.sample(prompts, seeds=[100, 101, 102, 103, 104, 105], stops=[2])
    assert sorted((b["seed"], b["n"], tuple(b["prompt"])) for b in posted) == [
        (100, 3, (1, 2)),
        (103, 2, (5,)),
        (105, 1, (1, 2)),
    ]
    assert [ids[0] for ids, _ in out] == [100, 101, 102, 103, 104, 105]  # row i sampled with seed i
    assert out[1] == ([101, 2], [-0.1, -0.2])
    body = posted[0]
    assert (body["temperature"], body["top_p"], body["top_k"], body["max_tokens"]) == (0.8, 1.0, 0, 5)
    assert body["stop_token_ids"] == [2] and body["logprobs"] == 0 and body["return_token_ids"] is True


def test_a_server_holding_weights_this_run_did_not_push_is_one_line():
    gen, _ = _client(held="ablate-abc-2")
    with pytest.raises(
        PeerLostError, match=r"holds weights this run did not push \(weight version ablate-abc-2"
    ):
        gen.sample([[1]], [7], [2])


def test_a_server_that_stops_answering_is_one_line_naming_it():
    gen = VLLMServerGenerator(ARGS, tokenizer=None, url="http://127.0.0.1:9", timeout_s=2)
    with pytest.raises(PeerLostError) as e:
        gen._get("/v1/models")
    line = str(e.value)
    assert line.startswith("the rollout server at http://127.0.0.1:9 stopped answering (connection refused)")
    assert "\n" not in line
    assert "resume with the same command" in line
    assert isinstance(e.value.__cause__, urllib.error.URLError | OSError)


def test_start_on_is_one_of_its_places(tmp_path):
    """Checked once, by the schema (ablate.schema.nodes.VLLMServer), before anything starts: `ablate plan` judges
    the config as `ablate train` does, without vLLM installed."""
    from conftest import ablate

    r = ablate(
        "plan", "method=grpo", "method/rollouts=vllm_server", "method.rollouts.start_on=k8s", cwd=tmp_path
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "ablate: error: method.rollouts.start_on=k8s: must be one of local, slurm, ray"
    assert not list(tmp_path.iterdir())


def test_a_run_resumes_with_its_server_elsewhere_but_not_with_another_setting():
    """Where the rollout server is (its url, how it is started, how long to wait) is not the run's identity: a run
    whose server restarted on another port resumes; what the run trains (a sampling setting) still counts."""
    from ablate.record.identity import config_changes, identity, same_overrides

    base = ["method=grpo", "method/rollouts=vllm_server", "method.rollouts.url=http://a:1"]
    assert same_overrides(base, [*base[:2], "method.rollouts.url=http://b:2", "method.rollouts.timeout_s=5"])
    assert not same_overrides(base, [*base, "method.args.temperature=0.5"])

    def cfg(**rollouts):
        from omegaconf import OmegaConf

        node = {
            "_target_": "ablate.rollouts.server.VLLMServerGenerator",
            "url": "http://a:1",
            "dtype": "float32",
        }
        node = {
            **node,
            **rollouts,
        }  # composed at method.rollouts, resolved again into the trainer's generator
        return OmegaConf.create(
            {"method": {"name": "grpo", "rollouts": node, "trainer": {"generator": node}}}
        )

    a, moved, other = (
        identity(cfg()),
        identity(cfg(url="http://b:2", start=True)),
        identity(cfg(dtype="bfloat16")),
    )
    assert (
        a["config_hash"] == moved["config_hash"]
        and moved["config"]["method"]["rollouts"]["url"] == "http://b:2"
    )
    assert a["config_hash"] != other["config_hash"]
    assert config_changes(a["config"], other["config"]) == [
        "method.rollouts.dtype (was float32, now bfloat16)",
        "method.trainer.generator.dtype (was float32, now bfloat16)",
    ]
    assert config_changes(a["config"], moved["config"]) == []
