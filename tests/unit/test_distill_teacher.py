"""method=distill's teacher: what the config gives becomes a model sharing the student's vocabulary, and the
default (the tiny task's scripted teacher) repeats each row's prompt letter."""

import pytest
import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM

from ablate.errors import ConfigError
from ablate.methods.distill import DistillConfig, DistillTrainer
from ablate.models import tiny
from ablate.models.teachers import letter_teacher


def _trainer(tmp_path, teacher):
    tok, student = tiny()
    return DistillTrainer(
        model=student,
        teacher=teacher,
        processing_class=tok,
        train_dataset=Dataset.from_list([{"prompt": "gggg"}] * 4),
        args=DistillConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True),
    )


def test_teacher_of_another_vocabulary_is_one_line(tmp_path):
    other = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=300,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    with pytest.raises(ConfigError, match="its vocabulary has 300 tokens, the student's 259"):
        _trainer(tmp_path, other)


def test_a_teacher_of_the_same_size_but_other_ids_is_one_line(tmp_path):
    """Same 259 tokens, the two first bytes' ids swapped: the sizes match, the distributions would not."""
    tok, teacher = tiny()
    vocab = tok.get_vocab()
    first, second = sorted(vocab, key=vocab.get)[3:5]
    swapped = dict(vocab) | {first: vocab[second], second: vocab[first]}
    other = type("Other", (), {"get_vocab": lambda self: swapped})()
    with pytest.raises(
        ConfigError, match=rf"the student's 259 tokens under other ids \({first!r} is 4 there, 3 here\)"
    ):
        _trainer(tmp_path, (other, teacher))


def test_a_reward_model_as_teacher_is_one_line(tmp_path):
    from transformers import LlamaForSequenceClassification

    classifier = LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=259,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            num_labels=1,
        )
    )
    with pytest.raises(
        ConfigError, match="a LlamaForSequenceClassification \\(a reward model\\), not a causal LM"
    ):
        _trainer(tmp_path, classifier)


def test_no_teacher_names_the_options(tmp_path):
    with pytest.raises(ConfigError, match=r"\+teacher=local teacher.path=DIR"):
        _trainer(tmp_path, None)


def test_a_builder_and_its_tokenizer_model_pair_are_both_taken(tmp_path):
    """The config hands a `_partial_` builder (conf/teacher/*.yaml), which returns (tokenizer, model)."""
    trainer = _trainer(tmp_path, lambda: letter_teacher(confidence=8.0))
    assert type(trainer.teacher).__name__ == "LetterTeacher" and not trainer.teacher.training


def test_letter_teacher_repeats_the_prompts_letter():
    """Left-padded rows: the first attended token is the letter; logit 8 on it, 0 elsewhere:
    p = e^8 / (e^8 + 258) = 0.9203 at every position."""
    tok, teacher = letter_teacher(confidence=8.0)
    g, d = (
        tok("g", add_special_tokens=False)["input_ids"][0],
        tok("d", add_special_tokens=False)["input_ids"][0],
    )
    ids = torch.tensor([[g, g, g, 5], [tok.pad_token_id, d, d, 7]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    probs = teacher(input_ids=ids, attention_mask=mask).logits.softmax(-1)
    assert probs.argmax(-1).tolist() == [[g] * 4, [d] * 4]
    torch.testing.assert_close(probs[0, 0, g], torch.tensor(0.9203), atol=1e-4, rtol=0)
