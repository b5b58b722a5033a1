# myrew.py
def short(completions, **kwargs):
    """Shorter is better: minus the completion's length in characters, over 8."""
    return [-len(c) / 8 for c in completions]
