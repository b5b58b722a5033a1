"""GRPO's rollouts: generation engines behind one seam (`GenerateFn`), the generation schedule
(`Schedule`), the buffer that serves and checkpoints a round (`Rollout`, `RolloutBuffer`), the
counters a rollout trainer declares (`RolloutStats`), and the batch geometry table."""
