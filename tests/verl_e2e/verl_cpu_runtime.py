"""What verl 0.9.1 needs to run ``python -m verl.trainer.main_ppo`` on a CPU-only machine under Ray (test harness).

This module exists only to rehearse calibrl's verl plugin inside verl's real distributed runtime (Ray driver,
TaskRunner, FSDP2 worker processes, agent-loop and reward-loop workers) on a machine without GPUs. It is not part of
calibrl's API. verl loads it in every process of the run, like the plugin itself:

    VERL_USE_EXTERNAL_MODULES=verl_cpu_runtime,calibrl.verl VERL_PLATFORM=cpu \\
    VERL_ENGINE_DEVICE=cuda VERL_ENGINE_VENDOR=nvidia PYTHONPATH=tests/verl_e2e python -m verl.trainer.main_ppo ...

It matches verl 0.9.1 exactly (:data:`VERL_VERSION`, checked at import: another version raises). Each patch below
names the verl code it works around; docs/verl.md ("verl end to end on the CPU") lists them with the overrides the
command line needs.

1. **Platform.** verl has no CPU platform and falls back to ``nvidia`` (NCCL). :class:`PlatformCPU` is registered
   as ``cpu`` in ``verl.plugin.platform.PlatformRegistry`` (``VERL_PLATFORM=cpu`` selects it): device ``cpu``,
   backend ``gloo``, Ray resource ``GPU`` (so verl's placement groups still ask for the fake GPUs given to
   ``ray.init``), ``current_device() == "cpu"`` (verl moves tensors with ``.to(get_device_id())``), seeding and
   synchronisation as CPU no-ops. Its device module (:class:`CPUDeviceModule`) is ``torch.cpu`` plus the
   memory-statistics calls verl makes on ``torch.cuda`` (``memory_reserved`` ..., all 0).
2. **Process group.** ``verl.utils.distributed.initialize_global_process_group_ray`` builds the backend string
   ``cpu:gloo,<device>:<backend>``, which is ``cpu:gloo,cpu:gloo`` here and rejected by torch; on this platform the
   default becomes ``gloo`` (:func:`_patch_process_group`).
3. **FSDP2 offload.** verl's FSDP2 engine offloads forward-only engines (the reference policy) with
   ``CPUOffloadPolicy(pin_memory=True)``; torch cannot pin memory without an accelerator, so on this platform the
   policy never pins (:func:`_patch_offload_policy`). verl's FSDP1 path needs a device id: use
   ``actor_rollout_ref.actor.strategy=fsdp2`` and ``actor_rollout_ref.ref.strategy=fsdp2``.
4. **Engines.** verl registers its FSDP engines for ``cuda`` and ``npu`` only; ``VERL_ENGINE_DEVICE=cuda
   VERL_ENGINE_VENDOR=nvidia`` (verl's own override) selects them; they run on whatever device the platform names.
5. **Rollout.** verl 0.9.1 generates only through an ``AgentLoopManager`` talking to a server-style
   ``RolloutReplica`` (vLLM, SGLang, TensorRT-LLM). :class:`HFReplica` is registered as rollout ``hf``
   (``actor_rollout_ref.rollout.name=hf``): it starts one Ray actor per replica, :class:`HFServer`, whose async
   ``generate`` samples with Hugging Face ``generate`` and returns verl's ``TokenOutput`` (token ids and their
   log-probs under the sampled model). In the hybrid actor/rollout worker, :class:`HFServerAdapter` (registered as
   ``("hf", "async")`` in ``verl.workers.rollout.base._ROLLOUT_REGISTRY``) receives verl's weight sync (the FSDP
   engine's full tensors, ``checkpoint_engine.backend=naive``) and copies them into the server's model, so each
   step samples from the current policy.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any, Optional

import torch

VERL_VERSION = "0.9.1"
PLATFORM = "cpu"
ROLLOUT = "hf"


def check_verl_version() -> str:
    """verl's version; a RuntimeError naming both versions unless it is :data:`VERL_VERSION`."""
    import verl

    found = getattr(verl, "__version__", "unknown")
    if found != VERL_VERSION:
        raise RuntimeError(
            f"verl_cpu_runtime patches verl {VERL_VERSION}; verl {found} is installed. Rebuild the environment with "
            "`bash scripts/setup_verl_env.sh .venv-verl`, or update tests/verl_e2e/verl_cpu_runtime.py for this verl."
        )
    return found


# --------------------------------------------------------------------------------------------------------------------
# 1. platform
# --------------------------------------------------------------------------------------------------------------------


class CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` with the ``torch.cuda`` calls verl 0.9.1 makes on ``get_torch_device()`` (memory statistics
    0, caches and IPC no-ops, RNG state the CPU generator's). Anything else is looked up on ``torch.cpu``."""

    def __init__(self) -> None:
        super().__init__("verl_cpu_runtime.device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def set_device(*_: Any, **__: Any) -> None:
        return None

    @staticmethod
    def synchronize(*_: Any, **__: Any) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def memory_allocated(*_: Any, **__: Any) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(*_: Any, **__: Any) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    @staticmethod
    def set_per_process_memory_fraction(*_: Any, **__: Any) -> None:
        return None

    @staticmethod
    def get_device_name(*_: Any, **__: Any) -> str:
        return "cpu"

    @staticmethod
    def get_rng_state(*_: Any, **__: Any) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, *_: Any, **__: Any) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


def _platform_class() -> type:
    """:class:`PlatformCPU`, built on verl's ``PlatformBase`` (imported lazily: verl imports this module early)."""
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(PlatformBase):
        """verl platform ``cpu``: torch's CPU device, gloo collectives, fake ``GPU`` Ray resources."""

        _module = CPUDeviceModule()

        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: self._module)

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:  # verl moves tensors with .to(get_device_id())
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: Optional[int] = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            return None  # torch.manual_seed, which verl also calls, seeds the CPU generator

        def manual_seed_all(self, seed: int) -> None:
            return None

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"  # ray.init(num_gpus=N) provides them; nothing uses a real GPU

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    return PlatformCPU


def _register_platform() -> None:
    """Register :class:`PlatformCPU` as ``cpu`` (selected by ``VERL_PLATFORM=cpu``)."""
    from verl.plugin.platform import PlatformRegistry

    if PlatformRegistry.get(PLATFORM) is None:
        PlatformRegistry.register(platform=PLATFORM)(_platform_class())


def on_cpu_platform() -> bool:
    """Whether verl's platform in this process is :class:`PlatformCPU`."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


# --------------------------------------------------------------------------------------------------------------------
# 2. process group
# --------------------------------------------------------------------------------------------------------------------


def _patch_process_group() -> None:
    """``verl.utils.distributed.initialize_global_process_group_ray(timeout_second, backend)`` with ``gloo`` as the
    default backend on the CPU platform (verl's default, ``cpu:gloo,cpu:gloo``, is rejected by torch). Patched
    before ``verl.workers.engine_workers`` binds it by name."""
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_cpu_runtime", False):
        return

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None and on_cpu_platform():
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray._cpu_runtime = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def _patch_offload_policy() -> None:
    """On the CPU platform, ``verl.utils.fsdp_utils.CPUOffloadPolicy`` never pins memory. verl's FSDP2 engine gives
    forward-only engines (the reference policy) ``CPUOffloadPolicy(pin_memory=True)``, and torch cannot pin memory
    without an accelerator ("Cannot access accelerator device when none is available"). Patched before
    ``verl.workers.engine.fsdp.transformer_impl`` binds it by name; a subclass, so torch's isinstance checks hold."""
    if not on_cpu_platform():
        return
    from verl.utils import fsdp_utils

    base = fsdp_utils.CPUOffloadPolicy
    if base is None or getattr(base, "_cpu_runtime", False):
        return

    class CPUOffloadPolicy(base):  # type: ignore[misc, valid-type]
        _cpu_runtime = True

        def __init__(self, pin_memory: bool = True) -> None:
            super().__init__(pin_memory=False)

    fsdp_utils.CPUOffloadPolicy = CPUOffloadPolicy


# --------------------------------------------------------------------------------------------------------------------
# 5. rollout: a Hugging Face generate() server behind verl's RolloutReplica interface
# --------------------------------------------------------------------------------------------------------------------


def server_name(replica_rank: int) -> str:
    """Ray actor name of the :class:`HFServer` of replica ``replica_rank`` (one node per replica)."""
    return f"{ROLLOUT}_server_{replica_rank}_0"


def response_log_probs(*, logits: torch.Tensor, response_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each response token under the model: ``log_softmax(logits)[t, response_ids[t]]``.

    logits [R, V]: the model's logits at the positions that predict the R response tokens (temperature 1, what
    vLLM reports as a token's logprob); response_ids [R]. Returns [R] float32.
    """
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, response_ids.long().unsqueeze(-1)).squeeze(-1)


class HFServer:
    """Token-in, token-out generation with a Hugging Face causal LM on the CPU (a Ray actor, one per replica).

    The methods are those verl 0.9.1's ``LLMServerClient`` and ``RolloutReplica`` call on a vLLM server actor:
    ``generate`` (returns ``TokenOutput``), ``update_weights`` (new policy weights), and the memory / scheduling
    controls (``sleep``, ``wake_up``, ``clear_kv_cache``, ...), which are no-ops here.
    """

    def __init__(self, *, model_path: str, rollout_config: Any, attn_implementation: str = "sdpa",
                 seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.config = rollout_config
        self.model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32,
                                                          attn_implementation=attn_implementation).eval()
        self.global_steps: Optional[int] = None
        self.weight_updates = 0
        torch.manual_seed(seed)  # generate() samples with the global generator; requests run one at a time

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       image_data: Any = None, video_data: Any = None, **_: Any) -> Any:
        """Sample one completion of ``prompt_ids`` with ``sampling_params`` (temperature, top_p, top_k, ...;
        ``max_tokens`` else verl's response budget); the log-probs of the sampled tokens when ``logprobs``."""
        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params)
        budget = self.config.prompt_length + self.config.response_length - len(prompt_ids)
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", min(self.config.response_length, budget)))
        max_tokens = max(1, min(int(max_tokens), budget))
        temperature = float(params.get("temperature", 1.0))
        top_k = params.get("top_k", -1)
        top_p = float(params.get("top_p", 1.0))
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        kwargs: dict[str, Any] = dict(max_new_tokens=max_tokens, pad_token_id=self.model.config.pad_token_id,
                                      eos_token_id=self.model.config.eos_token_id)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p,
                          top_k=None if top_k is None or int(top_k) <= 0 else int(top_k))
        else:
            kwargs.update(do_sample=False)
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            response = out[0, ids.shape[1]:]
            log_probs = None
            if params.get("logprobs"):
                logits = self.model(out).logits[0, ids.shape[1] - 1: out.shape[1] - 1]
                log_probs = response_log_probs(logits=logits, response_ids=response).tolist()
        eos = self.model.config.eos_token_id
        finished = eos is not None and len(response) > 0 and int(response[-1]) == int(eos)
        return TokenOutput(token_ids=response.tolist(), log_probs=log_probs,
                           stop_reason="completed" if finished else "length",
                           extra_fields={"global_steps": self.global_steps})

    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: Optional[int] = None) -> int:
        """Copy the actor's weights (HF names, full tensors) into the model; every model tensor must be given."""
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
        if missing or unexpected:
            raise RuntimeError(f"HFServer.update_weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.weight_updates += 1
        if global_steps is not None:
            self.global_steps = global_steps
        return self.weight_updates

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def stats(self) -> dict[str, Any]:
        return {"weight_updates": self.weight_updates, "global_steps": self.global_steps}

    async def _noop(self, *_: Any, **__: Any) -> None:
        return None

    sleep = wake_up = clear_kv_cache = release_kv_cache = resume_kv_cache = _noop
    resume_generation = open_submission_gate = resume_engine_generation = wait_for_requests_to_drain = _noop
    start_profile = stop_profile = _noop

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}


def _replica_class() -> type:
    """:class:`HFReplica` on verl's ``RolloutReplica`` (imported lazily)."""
    import ray
    from verl.workers.rollout.replica import RolloutReplica

    class HFReplica(RolloutReplica):
        """verl rollout ``hf``: one :class:`HFServer` actor per replica, next to the hybrid workers."""

        async def launch_servers(self) -> None:
            model = self.model_config
            override = dict(model.get("override_config", {}) or {})
            server = ray.remote(HFServer).options(
                name=server_name(self.replica_rank), max_concurrency=self.max_concurrency, num_cpus=0,
            ).remote(model_path=model.get("local_path", None) or model.path, rollout_config=self.config,
                     attn_implementation=override.get("attn_implementation", "sdpa"),
                     seed=self.config.seed + self.replica_rank if hasattr(self.config, "seed") else self.replica_rank)
            await server.stats.remote()  # constructed
            self.servers = [server]
            self._server_handle = server
            self._server_address = f"{ROLLOUT}-replica-{self.replica_rank}"

    return HFReplica


def _adapter_class() -> type:
    """:class:`HFServerAdapter` on verl's ``BaseRollout`` (imported lazily)."""
    import ray
    from verl.workers.rollout.base import BaseRollout

    class HFServerAdapter(BaseRollout):
        """The hybrid worker's side of rollout ``hf``: forwards verl's weight sync to the replica's
        :class:`HFServer` (rank 0 of each replica only); memory controls are no-ops on the CPU."""

        def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, model_config, device_mesh)
            per_replica = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                           * self.config.pipeline_model_parallel_size)
            rank = int(os.environ.get("RANK", "0"))
            self.replica_rank, self.rollout_rank = rank // per_replica, rank % per_replica
            self.server_handle = None

        def _server(self) -> Any:
            if self.server_handle is None:
                self.server_handle = ray.get_actor(server_name(self.replica_rank))
            return self.server_handle

        async def resume(self, tags: list[str]) -> None:
            return None

        async def release(self) -> None:
            return None

        @torch.no_grad()
        async def update_weights(self, weights: Any, wire_format: str = "named_tensors", global_steps: Any = None,
                                 **kwargs: Any) -> None:
            if wire_format != "named_tensors":
                raise NotImplementedError(f"rollout {ROLLOUT!r} takes full tensors, not {wire_format!r}")
            from verl.workers.rollout.utils import ensure_async_iterator

            state = {}
            async for name, tensor in ensure_async_iterator(weights):
                state[name] = tensor.detach().to("cpu", copy=True)
            if self.rollout_rank == 0:
                await self._server().update_weights.remote(state, global_steps)

    return HFServerAdapter


def _register_rollout() -> None:
    """Rollout ``hf``: the replica in ``RolloutReplicaRegistry`` and the worker adapter in ``_ROLLOUT_REGISTRY``."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT, _replica_class)
    base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{__name__}.HFServerAdapter"


def __getattr__(name: str) -> Any:  # HFServerAdapter for verl's importlib lookup, built on first use
    if name == "HFServerAdapter":
        cls = _adapter_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def install() -> None:
    """Apply every patch (idempotent). verl imports this module from its ``__init__``
    (``VERL_USE_EXTERNAL_MODULES``); the imports below are of verl modules that need nothing of the trainer."""
    check_verl_version()
    _register_platform()
    _patch_process_group()
    _patch_offload_policy()
    _register_rollout()


install()
