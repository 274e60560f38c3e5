"""The pieces of tests/verl_e2e/verl_cpu_runtime.py without Ray: version check, platform, the hf rollout server.

Runs in the verl environment (``make verl-e2e``; skipped where verl is not installed). Seconds, no Ray.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_e2e  # noqa: E402
import verl_cpu_runtime as rt  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_e2e.build_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _server(path: Path) -> rt.HFServer:
    cfg = SimpleNamespace(prompt_length=run_e2e.PROMPT_LENGTH, response_length=run_e2e.RESPONSE_LENGTH)
    return rt.HFServer(model_path=str(path), rollout_config=cfg)


def test_another_verl_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import verl

    assert rt.check_verl_version() == rt.VERL_VERSION
    monkeypatch.setattr(verl, "__version__", "0.9.2")
    with pytest.raises(RuntimeError, match=r"0\.9\.1.*0\.9\.2"):
        rt.check_verl_version()


def test_cpu_platform_is_registered_with_gloo_and_cpu_tensors() -> None:
    from verl.plugin.platform import PlatformRegistry

    platform = PlatformRegistry.get("cpu")()
    assert (platform.device_name, platform.communication_backend_name()) == ("cpu", "gloo")
    assert torch.ones(2).to(platform.current_device()).device.type == "cpu"
    module = platform.device_module
    assert module.memory_reserved() == 0 and module.memory_allocated() == 0
    free, total = module.mem_get_info()
    assert 0 < free <= total


def test_log_probs_are_the_models_token_log_softmax() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    got = rt.response_log_probs(logits=logits, response_ids=torch.tensor([0, 2]))
    z0 = torch.log(torch.exp(torch.tensor([2.0, 0.0, -1.0])).sum())
    torch.testing.assert_close(got, torch.stack([2.0 - z0, -torch.log(torch.tensor(3.0))]))


def test_server_samples_from_the_weights_it_was_sent(tiny_model: Path, tmp_path: Path) -> None:
    """After update_weights with another model's weights, greedy generation is that model's, and the returned
    log-probs are that model's log-probs of the returned tokens."""
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(run_e2e.build_model(tmp_path / "other", seed=1)).eval()
    server = _server(tiny_model)
    prompt = [5, 6, 7, 8]
    greedy = {"temperature": 0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    before = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=dict(greedy), request_id="a"))
    assert asyncio.run(server.update_weights(other.state_dict(), global_steps=3)) == 1
    after = asyncio.run(server.generate(prompt_ids=prompt, sampling_params=dict(greedy), request_id="b"))
    ids = torch.tensor([prompt])
    with torch.no_grad():
        expected = other.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=run_e2e.RESPONSE_LENGTH, pad_token_id=other.config.pad_token_id,
                                  eos_token_id=other.config.eos_token_id)[0, len(prompt):].tolist()
        full = torch.tensor([prompt + after.token_ids])
        logits = other(full).logits[0, len(prompt) - 1:-1]
    assert after.token_ids == expected and after.token_ids != before.token_ids
    torch.testing.assert_close(torch.tensor(after.log_probs), rt.response_log_probs(
        logits=logits, response_ids=torch.tensor(after.token_ids)))
    assert after.extra_fields["global_steps"] == 3


def test_server_refuses_incomplete_weights(tiny_model: Path) -> None:
    server = _server(tiny_model)
    state = dict(server.model.state_dict())
    state.pop("lm_head.weight")
    with pytest.raises(RuntimeError, match="lm_head.weight"):
        asyncio.run(server.update_weights(state))
