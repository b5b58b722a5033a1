"""GRPO's rollouts: generation engines behind one seam (`GenerateFn`) and the batch geometry of a
generation round."""
