"""The project's tokenizer as a ``transformers`` fast tokenizer: the same ``tokenizers`` object,
so ``AutoTokenizer`` gives exactly the project's token ids."""

from __future__ import annotations

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast


def as_hf_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """``tokenizer`` with ``<|endoftext|>`` as its end-of-text, beginning (lm-eval's prefix for a
    rolling log-likelihood) and pad token, as GPT-2's; decoding keeps spaces as they are."""
    from mcsd.data.tokenizer import EOS_TOKEN, eos_id  # here: mcsd.data imports Lightning, slow to import

    eos_id(tokenizer)  # a tokenizer without the separator is refused in one line
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN,
                                   pad_token=EOS_TOKEN, clean_up_tokenization_spaces=False)
