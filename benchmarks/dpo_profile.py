"""Where a compute-bound DPO step goes (the `--preset compute` config of dpo_vs_trl.py), in CPU seconds.

    OMP_NUM_THREADS=1 python benchmarks/dpo_profile.py

Times one batch of 8 pairs through each part, for the plain layout and each speed path: forward
(backbone, then LM head + log-softmax), backward, optimizer step, collation, and the start-up parts
(tokenising, reference precompute). CPU time of this process (robust on a shared machine), median of 3.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset

sys.path.insert(0, str(Path(__file__).parent))
from dpo_vs_trl import long_sort  # noqa: E402

from ablate.losses.logps import sequence_logps, token_logps  # noqa: E402
from ablate.methods.dpo import DPOConfig, DPOTrainer  # noqa: E402
from ablate.models import tiny  # noqa: E402
from ablate.speed.head import completion_logps  # noqa: E402
from ablate.speed.pairs import plain_targets  # noqa: E402


def cpu(f, n: int = 3) -> float:
    ts = []
    for _ in range(n):
        t = time.process_time()
        f()
        ts.append(time.process_time() - t)
    return statistics.median(ts)


def main() -> None:
    tok, model = tiny(hidden_size=512, num_layers=8, intermediate_size=2048)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, vocab {len(tok)}")
    args = DPOConfig(
        output_dir="/tmp/dpo-profile",
        per_device_train_batch_size=8,
        report_to="none",
        use_cpu=True,
        bf16=True,
        max_length=256,
        precompute_ref_log_probs=False,
    )
    rows = Dataset.from_list(long_sort(64))
    t = time.process_time()
    trainer = DPOTrainer(model=model, args=args, train_dataset=rows, processing_class=tok)
    print(f"start-up: tokenise {len(rows)} pairs + build trainer {time.process_time() - t:.2f} s")
    full = trainer.speed_plan  # the default: pair rows, completion-only logits, padding-free
    for share in (False, True):
        trainer.data_collator.share_prompt = share
        trainer.speed_plan = full if share else full.turned_off("dpo_pair_rows")
        t = time.process_time()
        trainer._with_ref_logps(trainer.train_dataset)
        print(
            f"start-up: reference precompute of {len(rows)} pairs, share_prompt={share}: "
            f"{time.process_time() - t:.2f} s"
        )
    trainer.data_collator.share_prompt = False
    ex = [trainer.train_dataset[i] for i in range(8)]
    b = trainer.data_collator(ex)
    trainer.data_collator.share_prompt = True
    print(f"collate: {cpu(lambda: trainer.data_collator(ex), 5) * 1e3:.1f} ms (both layouts)")
    bs = trainer.data_collator(ex)
    print(
        f"tokens: plain {int(b['attention_mask'].sum())} real / {b['input_ids'].numel()} padded; shared "
        f"{int((bs['shared_position_ids'] > 0).sum()) + len(ex)} real / {bs['shared_input_ids'].numel()} padded; "
        f"{len(bs['shared_src'])} scored"
    )
    model.train()
    backbone, head = model.model, model.lm_head
    where = plain_targets(b["input_ids"], b["completion_mask"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hid = backbone(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"]
        ).last_hidden_state.detach()
        print(
            f"forward backbone (plain layout): {cpu(lambda: backbone(input_ids=b['input_ids'], attention_mask=b['attention_mask'])):.2f} s"
        )
        print(
            f"lm_head + log-softmax, all positions: "
            f"{cpu(lambda: sequence_logps(token_logps(head(hid), b['input_ids']), b['completion_mask'][:, 1:])):.3f} s"
        )
        print(
            f"lm_head + log-softmax, completion positions: "
            f"{cpu(lambda: completion_logps(hid.flatten(0, 1)[where['src']], head, where['tgt'])):.3f} s"
        )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for name, plan in (
        ("plain", full.turned_off("dpo_pair_rows", "completion_only_logits", "padding_free")),
        ("shared+logits", full.turned_off("padding_free")),
    ):
        trainer.speed_plan = plan
        batch = bs if plan.on("dpo_pair_rows") else b
        batch = {**batch, "ref_chosen_logps": torch.zeros(8), "ref_rejected_logps": torch.zeros(8)}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fwd = cpu(lambda: trainer.compute_loss(model, batch))

            def fb() -> None:
                trainer.compute_loss(model, batch).backward()

            both = cpu(fb)
        model.zero_grad()
        print(
            f"{name}: forward (with grad) {fwd:.2f} s, backward {both - fwd:.2f} s, forward+backward {both:.2f} s"
        )
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    print(f"optimizer step (AdamW): {cpu(opt.step):.3f} s")


if __name__ == "__main__":
    main()
