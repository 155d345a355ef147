"""Every registered architecture as a Hugging Face transformers model: export, AutoModel loading,
logits, generate (greedy, padded batches, beam search, assisted), labels, the tokenizer, a fresh
process with trust_remote_code, mcsd-export's bad inputs, and exported folders in the harness."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

import mcsd
from mcsd.files import default_file_mode
from helpers.models import SIXTEEN_BIT_TOLERANCE, relative_rms_error, tiny_config, variant_cases
from helpers.runs import FAST, command, run_here
from mcsd.checkpoint.model_source import resolve
from mcsd.data.tokenizer import train_tokenizer
from mcsd.errors import MCSDError
from mcsd.commands.evaluate import evaluate
from mcsd.commands.export import export, write_export
from mcsd.commands.generate import generate as mcsd_generate
from mcsd.hf import DecodingCache, MCSDHFConfig, MCSDHFForCausalLM, MCSDHFModel, as_hf_model
from mcsd.hf.cache import CACHE_KEY
from mcsd.hf.configuration import REMOTE_CODE_FILE
from mcsd.checkpoint.saved_model import load_weights

pytestmark = pytest.mark.slow  # end-to-end runs, every test here

VOCAB = 300
TEXT = ("the king of a far land ships gold and silver to every harbour along the coast; "
        "Über-naïve café owners count 12 345 coins\n\n") * 30
CASES = variant_cases()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """For every architecture and variant: a saved tiny model folder and its export."""
    root = tmp_path_factory.mktemp("hf")
    tokenizer = train_tokenizer([TEXT], VOCAB)
    folders = {}
    for index, case in enumerate(CASES):
        torch.manual_seed(index)
        model = mcsd.build_model(tiny_config(case, vocab_size=VOCAB)).eval()
        saved = mcsd.save(model, root / f"saved-{index}", tokenizer)
        folders[case] = (saved, write_export(model, tokenizer, root / f"exported-{index}", "card\n"))
    return folders


def prompt_ids(tokenizer, text: str = "the king of a far") -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text).ids])


@pytest.mark.parametrize("case", CASES)
def test_exported_model_equals_the_project_model(case: str, exported: dict[str, tuple[Path, Path]]) -> None:
    """Logits (both forms), the labels loss, greedy generate against mcsd-generate, beam search
    with the cache against beam search without it, and the loaded weights."""
    saved, folder = exported[case]
    model, tokenizer = mcsd.load(saved), mcsd.load_tokenizer(saved)
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert isinstance(hf_model, MCSDHFForCausalLM) and hf_model.config.architecture == case.split("/")[0]
    ids = torch.tensor([tokenizer.encode(TEXT[:200]).ids[:40]])
    with torch.no_grad():
        expected = model(ids)
        for use_cache in (False, True):
            logits = hf_model(ids, use_cache=use_cache).logits
            assert ((logits - expected).abs().max() / expected.abs().max()).item() <= 1e-6
        labels = ids.clone()
        labels[:, :5] = -100
        loss = hf_model(ids, labels=labels, use_cache=False).loss
        targets = torch.cat([labels[:, 1:], torch.full((1, 1), -100)], dim=1)
        assert torch.equal(loss, model.loss(ids, targets)[0])
        kept = hf_model(ids, use_cache=False, logits_to_keep=3).logits  # the LM head on 3 rows: rounding may differ
        assert kept.shape == (1, 3, VOCAB) and torch.allclose(kept, expected[:, -3:], rtol=1e-6, atol=1e-7)
    generated = hf_model.generate(prompt_ids(tokenizer), max_new_tokens=32, do_sample=False)
    cfg = OmegaConf.create({"ckpt": str(saved), "prompt": "the king of a far", "max_new_tokens": 32, "temperature": 0,
                            "top_k": None, "top_p": None, "seed": 0, "device": "cpu", "dtype": "auto", "stop_at_eos": True,
                            "compile": False, "cuda_graphs": False})
    new = generated[0, prompt_ids(tokenizer).shape[1]:].tolist()
    eos = tokenizer.token_to_id("<|endoftext|>")
    assert mcsd_generate(cfg) == "the king of a far" + tokenizer.decode(new[: new.index(eos)] if eos in new else new)
    stream = [int(token) for token in model.stream(prompt_ids(tokenizer), 32, eos_token_id=eos)]
    assert new == stream
    batch = torch.tensor([tokenizer.encode("the king of a far").ids[:4], tokenizer.encode("gold and silver").ids[:4]])
    beams = hf_model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=8, num_beams=3,
                              do_sample=False, eos_token_id=None)
    uncached = hf_model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=8, num_beams=3,
                                 do_sample=False, eos_token_id=None, use_cache=False)
    assert torch.equal(beams, uncached)
    assert all(torch.equal(value, mcsd.load(folder).state_dict()[key]) for key, value in model.state_dict().items())


@pytest.mark.parametrize("dtype", list(SIXTEEN_BIT_TOLERANCE), ids=str)
@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_exported_model_loads_in_16_bits_and_generates(case: str, dtype: torch.dtype,
                                                       exported: dict[str, tuple[Path, Path]]) -> None:
    """``from_pretrained(folder, dtype=bfloat16 / float16)``: the weights in that dtype, the logits of
    both forms and of every step of ``generate`` within :data:`SIXTEEN_BIT_TOLERANCE` of the fp32
    model's along the same tokens."""
    saved, folder = exported[case]
    model, tokenizer = mcsd.load(saved), mcsd.load_tokenizer(saved)
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    assert {parameter.dtype for parameter in hf_model.parameters()} == {dtype}
    tolerance = SIXTEEN_BIT_TOLERANCE[dtype]
    ids = torch.tensor([tokenizer.encode(TEXT[:200]).ids[:40]])
    expected = model(ids)
    for use_cache in (False, True):
        logits = hf_model(ids, use_cache=use_cache).logits
        assert logits.dtype == dtype and relative_rms_error(logits, expected) < tolerance, use_cache
    prompt = prompt_ids(tokenizer)
    output = hf_model.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None,
                               return_dict_in_generate=True, output_logits=True)
    assert output.sequences.shape == (1, prompt.shape[1] + 12)
    steps = torch.stack(output.logits, dim=1)  # the logits each new token was chosen from
    along = model(output.sequences)[:, prompt.shape[1] - 1:-1]
    assert relative_rms_error(steps, along) < tolerance


@pytest.mark.parametrize("case", CASES)
def test_padded_batches_give_each_row_what_it_gives_alone(case: str, exported: dict[str, tuple[Path, Path]]) -> None:
    """Rows padded on the left and on the right, in one batched pass: a forward with and without
    a cache (each row's logits those it gets alone), greedy decoding, sampling (top-1, its code
    path) and beam search (each row's new tokens those it gets alone, at ``[:, width:]`` after the
    rows as given)."""
    saved, folder = exported[case]
    tokenizer = mcsd.load_tokenizer(saved)
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    hf_tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = ["the king of a far land ships gold", "silver to", "every harbour along"]
    decoding = {"greedy": {"do_sample": False}, "sampled": {"do_sample": True, "top_k": 1},
                "beams": {"do_sample": False, "num_beams": 2}}
    alone = {name: [hf_model.generate(prompt_ids(tokenizer, text), max_new_tokens=6, eos_token_id=None,
                                      **settings)[0, -6:] for text in texts] for name, settings in decoding.items()}
    for side in ("right", "left"):
        hf_tokenizer.padding_side = side
        batch = hf_tokenizer(texts, return_tensors="pt", padding=True)
        width = batch.input_ids.shape[1]
        with torch.no_grad():
            for use_cache in (False, True):
                logits = hf_model(**batch, use_cache=use_cache).logits
                for row, text in enumerate(texts):
                    columns = batch.attention_mask[row].bool()
                    single = hf_model(prompt_ids(tokenizer, text)).logits[0]
                    assert torch.allclose(logits[row, columns], single, rtol=1e-5, atol=1e-6), (side, use_cache, row)
        for name, settings in decoding.items():
            generated = hf_model.generate(**batch, max_new_tokens=6, eos_token_id=None, **settings)
            assert generated.shape == (3, width + 6) and torch.equal(generated[:, :width], batch.input_ids)
            for row, sequence in enumerate(alone[name]):
                assert torch.equal(generated[row, width:], sequence), (side, name, row)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", ["mcsd/full", "transformer/default", "wonderful_matrices/default+attention_every=2"])
def test_a_padded_batch_in_16_bits_gives_each_row_what_it_gives_alone(case: str, dtype: torch.dtype,
                                                                       exported: dict[str, tuple[Path, Path]]) -> None:
    """A model cast to 16 bits, a left-padded batch with a cache: the prefill's and each decoding
    step's logits of every row those of the row alone, to 16-bit rounding (fp32 states)."""
    _, folder = exported[case]
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval().to(dtype)
    rows = [torch.randint(1, VOCAB, (length,)) for length in (9, 4, 6)]
    ids, mask = torch.zeros(3, 9, dtype=torch.long), torch.zeros(3, 9, dtype=torch.long)
    for row, tokens in enumerate(rows):
        ids[row, 9 - len(tokens):], mask[row, 9 - len(tokens):] = tokens, 1
    following = torch.randint(1, VOCAB, (3, 3))
    with torch.no_grad():
        output = hf_model(ids, attention_mask=mask)
        batched, cache = [output.logits[:, -1]], getattr(output, CACHE_KEY)
        for column in following.T:
            output = hf_model(column[:, None], **{CACHE_KEY: cache})
            batched.append(output.logits[:, -1])
        for row, tokens in enumerate(rows):
            output = hf_model(tokens[None])
            alone, cache = [output.logits[:, -1]], getattr(output, CACHE_KEY)
            for token in following[row]:
                output = hf_model(token.view(1, 1), **{CACHE_KEY: cache})
                alone.append(output.logits[:, -1])
            for ours, theirs in zip(batched, alone, strict=True):
                assert ours.dtype == dtype
                assert relative_rms_error(ours[row:row + 1].float(), theirs.float()) < SIXTEEN_BIT_TOLERANCE[dtype], row


def test_a_row_with_padding_between_its_tokens_is_refused_in_one_line(exported: dict[str, tuple[Path, Path]]) -> None:
    _, folder = exported["mcsd/full"]
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(1, VOCAB, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 1, 1]])
    with pytest.raises(MCSDError, match="attention_mask row 1 has padding between its tokens: pad each row before "
                                        "or after its tokens") as error:
        hf_model(ids, attention_mask=mask)
    assert "\n" not in str(error.value)
    pytest.importorskip("torchscale")  # RetNet through torchscale's layer, which knows one sequence
    torchscale = as_hf_model(mcsd.build_model(tiny_config("retnet", vocab_size=VOCAB, implementation="torchscale")),
                             0).eval()
    mask[1] = torch.tensor([0, 0, 1, 1, 1, 1])
    with pytest.raises(MCSDError, match="retnet .this implementation. cannot keep a padded row's padding apart"):
        torchscale(ids, attention_mask=mask)
    assert torch.equal(torchscale(ids, attention_mask=mask.flip(1), use_cache=False).logits,
                       torchscale(ids, use_cache=False).logits)  # right padding without a cache: causal, exact


def test_assisted_decoding_crops_attention_caches_and_is_refused_for_recurrent_states(
        exported: dict[str, tuple[Path, Path]]) -> None:
    for case in ("transformer/default", "mcsd/full"):
        saved, folder = exported[case]
        ids = prompt_ids(mcsd.load_tokenizer(saved))
        hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
        assistant = AutoModelForCausalLM.from_pretrained(folder).eval()
        greedy = hf_model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
        if case.startswith("transformer"):
            assisted = hf_model.generate(ids, assistant_model=assistant, max_new_tokens=12, do_sample=False,
                                         eos_token_id=None)
            assert torch.equal(assisted, greedy)
        else:
            for assisted in ({"assistant_model": assistant}, {"prompt_lookup_num_tokens": 3}):
                with pytest.raises(MCSDError, match=rf"generate\({next(iter(assisted))}=\.\.\.\): assisted decoding "
                                   "takes rejected draft tokens back by cropping the cache, and mcsd's recurrent"):
                    hf_model.generate(ids, **assisted, max_new_tokens=12, do_sample=False)
            cache = getattr(hf_model(ids), CACHE_KEY)
            with pytest.raises(MCSDError, match="a recurrent decoding state cannot be cropped"):
                cache.crop(-1)


def test_auto_classes_config_and_hidden_states(exported: dict[str, tuple[Path, Path]]) -> None:
    saved, folder = exported["rwkv4/default+perspectives=2"]
    model = mcsd.load(saved)
    config = AutoConfig.from_pretrained(folder)
    assert isinstance(config, MCSDHFConfig) and config.model_type == "mcsd"
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (VOCAB, 24, 2)
    assert config.mcsd_model == model.config.to_dict() and config.use_cache
    assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"] == \
        "modeling_mcsd.MCSDHFForCausalLM"
    base = AutoModel.from_pretrained(folder).eval()
    assert isinstance(base, MCSDHFModel)
    ids = torch.randint(1, VOCAB, (2, 9))
    with torch.no_grad():
        output = base(ids)
        assert torch.allclose(output.last_hidden_state, model.hidden_states(ids), rtol=1e-6, atol=1e-6)
        cache = getattr(output, CACHE_KEY)
        assert isinstance(cache, DecodingCache) and cache.get_seq_length() == 9
    trained = AutoModelForCausalLM.from_pretrained(folder).train()  # fine-tuning: the training form, no state
    output = trained(ids, labels=ids)
    output.loss.backward()
    assert getattr(output, CACHE_KEY) is None and trained.model.embed.weight.grad is not None
    assert torch.equal(output.loss.detach(), model.loss(ids, torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1))[0])


HIDDEN_STATE_CASES = ["mcsd/full", "transformer/default", "rwkv4/default+perspectives=2"]


@pytest.mark.parametrize("case", HIDDEN_STATE_CASES)
def test_hidden_states_embeddings_tuples_and_what_is_refused(case: str,
                                                             exported: dict[str, tuple[Path, Path]]) -> None:
    """``output_hidden_states`` (the embeddings, each later layer's input, the final-normed output:
    alike with and without a cache, and in ``generate``), ``inputs_embeds`` in a forward and in
    ``generate``, ``return_dict=False``, and ``output_attentions`` refused in one line."""
    saved, folder = exported[case]
    model = mcsd.load(saved)
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert hf_model.config.num_attention_heads == model.config.num_channels
    ids = torch.randint(1, VOCAB, (2, 9))
    with torch.no_grad():
        plain = hf_model(ids, use_cache=False, output_hidden_states=True)
        assert len(plain.hidden_states) == model.config.num_layers + 1
        assert torch.allclose(plain.hidden_states[0], model.embed(ids), rtol=0, atol=1e-7)  # perspectives: merged
        assert torch.equal(plain.hidden_states[-1], model.hidden_states(ids))
        cached = hf_model(ids, output_hidden_states=True)
        for ours, theirs in zip(cached.hidden_states, plain.hidden_states, strict=True):
            assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        assert hf_model(ids).hidden_states is None
        embedded = hf_model(inputs_embeds=model.embed(ids), use_cache=False).logits
        assert torch.equal(embedded, plain.logits)
        as_tuple = hf_model(ids, labels=ids, use_cache=False, return_dict=False)
        assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[1], plain.logits)
        generated = hf_model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None,
                                      output_hidden_states=True, return_dict_in_generate=True)
        assert [len(step) for step in generated.hidden_states] == [model.config.num_layers + 1] * 4
        assert generated.hidden_states[1][-1].shape == (2, 1, model.config.hidden_size)
        from_embeddings = hf_model.generate(inputs_embeds=model.embed(ids), max_new_tokens=4, do_sample=False,
                                            eos_token_id=None)
        assert torch.equal(from_embeddings, generated.sequences[:, 9:])  # transformers returns the new tokens
        with pytest.raises(MCSDError, match="output_attentions=True: mcsd models form no attention weights") as error:
            hf_model(ids, output_attentions=True)
        assert "\n" not in str(error.value)
    assert MCSDHFForCausalLM._is_stateful and hf_model._is_stateful == (case != "transformer/default")


@pytest.mark.parametrize("case", ["mcsd/full", "transformer/default"])
def test_torch_export_takes_an_attention_mask(case: str, exported: dict[str, tuple[Path, Path]]) -> None:
    """``torch.export`` of a forward given a right-padded ``attention_mask``: the exported program's
    logits equal the eager model's (the left-padding check stays out of the traced graph)."""
    _, folder = exported[case]
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(1, VOCAB, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask, "use_cache": False}
    program = torch.export.export(hf_model, args=(), kwargs=inputs)
    with torch.no_grad():
        assert torch.equal(program.module()(**inputs).logits, hf_model(**inputs).logits)


def test_gradient_checkpointing_is_the_layers_own(exported: dict[str, tuple[Path, Path]]) -> None:
    """``gradient_checkpointing_enable`` turns on each layer's activation checkpointing (every
    ``every_n_layers``-th), with the same gradients; ``..._disable`` turns it off."""
    _, folder = exported["mcsd/full"]
    hf_model = AutoModelForCausalLM.from_pretrained(folder).train()
    ids = torch.randint(1, VOCAB, (2, 12))
    gradients = []
    for enable in (False, True):
        if enable:
            hf_model.gradient_checkpointing_enable()
            assert hf_model.is_activation_checkpointing
            assert [layer.activation_checkpointing for layer in hf_model.model.layers] == [True, True]
        hf_model.zero_grad()
        hf_model(ids, labels=ids).loss.backward()
        gradients.append([parameter.grad.clone() for parameter in hf_model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*gradients, strict=True))
    hf_model.activation_checkpointing_enable(every_n_layers=2)
    assert [layer.activation_checkpointing for layer in hf_model.model.layers] == [True, False]
    hf_model.gradient_checkpointing_disable()
    assert not hf_model.is_activation_checkpointing


FINE_TUNE = """
import sys, torch
from pathlib import Path
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
assert "mcsd" not in sys.modules


def fine_tune(folder, out):
    torch.manual_seed(0)
    ids = torch.randint(1, {vocab}, (4, 16))
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    model.eval().save_pretrained(out / "resaved")  # a plain re-save
    with torch.no_grad():
        torch.save(model(ids, use_cache=False).logits, out / "resaved.pt")
    model.resize_token_embeddings({vocab} + 3)  # as adding special tokens does
    data = [{{"input_ids": row, "labels": row}} for row in torch.randint(1, {vocab} + 3, (8, 16))]
    arguments = TrainingArguments(out / "trainer", max_steps=3, per_device_train_batch_size=2, gradient_checkpointing=True,
                                  report_to=[], save_strategy="no", use_cpu=True, learning_rate=1e-2)
    trainer = Trainer(model=model.train(), args=arguments, train_dataset=data)
    assert trainer.train().training_loss > 0 and model.is_activation_checkpointing
    trainer.save_model(out / "fine_tuned")
    with torch.no_grad():
        torch.save(model.eval()(ids, use_cache=False).logits, out / "fine_tuned.pt")
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True),
                          LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0))
    trainer = Trainer(model=lora.train(), args=arguments, train_dataset=[{{**row, "input_ids": row["input_ids"] % {vocab},
                      "labels": row["labels"] % {vocab}}} for row in data])
    trainer.train()
    merged = lora.merge_and_unload().eval()
    merged.save_pretrained(out / "lora_merged")
    with torch.no_grad():
        torch.save(merged(ids, use_cache=False).logits, out / "lora_merged.pt")
    torch.save(ids, out / "ids.pt")


for folder, out in zip(sys.argv[1::2], sys.argv[2::2]):
    fine_tune(Path(folder), Path(out))
"""

LOAD_AGAIN = """
import sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
assert "mcsd" not in sys.modules
for out in map(Path, sys.argv[1:]):
    ids = torch.load(out / "ids.pt")
    for name in ("resaved", "fine_tuned", "lora_merged"):
        model = AutoModelForCausalLM.from_pretrained(out / name, trust_remote_code=True).eval()
        with torch.no_grad():
            assert torch.equal(model(ids, use_cache=False).logits, torch.load(out / f"{name}.pt")), name
        print(out.name, name, model.config.vocab_size, sorted(path.name for path in (out / name).iterdir()))
"""


def test_resaved_resized_and_fine_tuned_models_load_in_a_fresh_process(tmp_path: Path,
                                                                         exported: dict[str, tuple[Path, Path]]) -> None:
    """In processes that never import mcsd, for MCSD and the Transformer: a re-saved export; one
    resized, fine-tuned by ``Trainer`` with gradient checkpointing and saved by ``save_model``; one
    fine-tuned with a PEFT LoRA and merged. Each loads with ``trust_remote_code`` and gives the
    logits it gave when saved."""
    cases = {"mcsd": "mcsd/full", "transformer": "transformer/default"}
    outs = {name: tmp_path / name for name in cases}
    for out in outs.values():
        out.mkdir()
    pairs = [str(part) for name, case in cases.items() for part in (exported[case][1], outs[name])]
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TOKENIZERS_PARALLELISM": "false"}
    for script, argv in ((FINE_TUNE.format(vocab=VOCAB), pairs), (LOAD_AGAIN, [str(out) for out in outs.values()])):
        result = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=900,
                                env=env)
        assert result.returncode == 0, result.stderr[-3000:]
    saved = ["config.json", "generation_config.json", "model.safetensors", REMOTE_CODE_FILE]
    for name in cases:
        assert f"{name} resaved {VOCAB} {saved}" in result.stdout and f"{name} lora_merged {VOCAB} {saved}" in result.stdout
        assert f"{name} fine_tuned {VOCAB + 3} {sorted([*saved, 'training_args.bin'])}" in result.stdout


def test_forward_takes_the_cache_by_either_name(exported: dict[str, tuple[Path, Path]]) -> None:
    """``past_key_values`` (transformers <= 5.23) and ``cache`` (5.24 on) name the same cache;
    the output carries it under the installed version's name."""
    saved, folder = exported["mcsd/full"]
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(1, VOCAB, (2, 9))
    with torch.no_grad():
        whole = hf_model(ids).logits[:, -1]
        steps = []
        for name in ("past_key_values", "cache"):
            cache = getattr(hf_model(ids[:, :8]), CACHE_KEY)
            steps.append(hf_model(ids[:, 8:], **{name: cache}).logits[:, -1])
            assert cache.get_seq_length() == 9
        assert torch.equal(steps[0], steps[1]) and torch.allclose(steps[0], whole, rtol=1e-5, atol=1e-5)
        with pytest.raises(MCSDError, match="given both cache and past_key_values") as error:
            hf_model(ids[:, 8:], cache=cache, past_key_values=cache)
        assert "\n" not in str(error.value)


def test_the_tokenizer_gives_the_project_ids(exported: dict[str, tuple[Path, Path]]) -> None:
    saved, folder = exported["mcsd/full"]
    tokenizer, hf_tokenizer = mcsd.load_tokenizer(saved), AutoTokenizer.from_pretrained(folder)
    text = "  the king\tof\n\na far  land: Über café 12 345 🙂<|endoftext|>gold and\u00a0silver "
    assert hf_tokenizer(text).input_ids == tokenizer.encode(text).ids
    assert tokenizer.token_to_id("<|endoftext|>") in hf_tokenizer(text).input_ids
    assert hf_tokenizer.eos_token_id == hf_tokenizer.pad_token_id == tokenizer.token_to_id("<|endoftext|>")
    ids = tokenizer.encode(text).ids
    assert hf_tokenizer.decode(ids) == tokenizer.decode(ids, skip_special_tokens=False)


def test_a_fresh_process_loads_every_export_with_remote_code(exported: dict[str, tuple[Path, Path]],
                                                              tmp_path: Path) -> None:
    """A process that never imported mcsd: trust_remote_code loads each folder (its
    modeling_mcsd.py imports the installed package), with the project model's logits."""
    ids = torch.randint(1, VOCAB, (1, 12))
    for index, case in enumerate(CASES):
        saved, _ = exported[case]
        with torch.no_grad():
            torch.save(mcsd.load(saved)(ids), tmp_path / f"{index}.pt")
    folders = [str(exported[case][1]) for case in CASES]
    script = f"""
import sys, torch
from transformers import AutoModelForCausalLM
ids = torch.tensor({ids.tolist()})
assert "mcsd" not in sys.modules
for index, folder in enumerate({folders!r}):
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    expected = torch.load({str(tmp_path)!r} + f"/{{index}}.pt")
    with torch.no_grad():
        error = ((model(ids).logits - expected).abs().max() / expected.abs().max()).item()
    assert error <= 1e-6, (folder, error)
print("loaded", len({folders!r}), "modules" , type(model).__module__)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"loaded {len(CASES)} modules mcsd.hf.modeling" in result.stdout


def test_exported_folders_and_hub_ids_load_in_the_harness(exported: dict[str, tuple[Path, Path]], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """mcsd.load, load_tokenizer and init_from read an exported folder; a Hub repository id is
    read from the Hugging Face cache (offline here) and named in one line when it cannot be had."""
    saved, folder = exported["mcsd/full"]
    model = mcsd.load(saved)
    fresh = mcsd.build_model(model.config)
    load_weights(fresh, folder)
    assert all(torch.equal(value, fresh.state_dict()[key]) for key, value in model.state_dict().items())
    assert mcsd.load_tokenizer(folder).encode(TEXT).ids == mcsd.load_tokenizer(saved).encode(TEXT).ids
    assert mcsd.locate(folder).kind == "exported"
    source = resolve(str(folder), "tiny")  # mcsd-bench models=[FOLDER]
    assert (source.kind, source.architecture.name, source.variant) == ("saved", "mcsd", "full")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (broken / "config.json").write_text(json.dumps({"model_type": "mcsd"}))
    with pytest.raises(MCSDError, match="config.json has no mcsd_model: export the model again"):
        mcsd.load(broken)
    snapshot = tmp_path / "hub" / "models--someone--tiny-mcsd" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for file in folder.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    from_hub = mcsd.load("someone/tiny-mcsd")
    assert all(torch.equal(value, from_hub.state_dict()[key]) for key, value in model.state_dict().items())
    with pytest.raises(FileNotFoundError, match="someone/missing is not a local path, and as a Hub repository it "
                                                "could not be downloaded"):
        mcsd.load("someone/missing")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of mcsd-train as a user starts it (its .hydra/ records the command and the data)."""
    root = tmp_path_factory.mktemp("hf-train")
    result = run_here("mcsd-train", *FAST, "logger=csv", "paths.log_dir=logs", cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (root / "logs" / "train" / "runs").iterdir()
    return run_dir


def test_mcsd_export_writes_a_folder_with_its_model_card_and_refuses_bad_input(
        trained_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offline = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": None, "HF_HOME": str(tmp_path / "hf-home")}
    out = tmp_path / "exported"
    # mcsd-export's task in this process (the push below through the command's entry point).
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        assert export(compose("export", overrides=[f"ckpt={trained_run}", f"out={out}"])) == out
    assert sorted(path.name for path in out.iterdir()) == [
        "README.md", "config.json", "generation_config.json", "model.safetensors", "modeling_mcsd.py",
        "tokenizer.json", "tokenizer_config.json"]
    # Every file readable by others, as one made with open(): the weights too (safetensors writes 0600).
    assert {path.name: oct(path.stat().st_mode & 0o777) for path in out.iterdir()} == {
        path.name: oct(default_file_mode()) for path in out.iterdir()}
    card = (out / "README.md").read_text()
    assert "| architecture | MCSD (`mcsd`), variant `full` |" in card
    assert f"| parameters | {sum(p.numel() for p in mcsd.load(trained_run).parameters()):,} |" in card
    assert "| training tokens | 3,072 |" in card and "| data | `data=embedded` |" in card
    assert "| final validation perplexity | " in card and "| command | `mcsd-train " in card
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([[5, 17, 99, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids, use_cache=False).logits, mcsd.load(trained_run)(ids))
    generation = {"prompt": "The", "max_new_tokens": 12, "temperature": 0, "top_k": None, "top_p": None, "seed": 0,
                  "device": "cpu", "dtype": "auto", "stop_at_eos": True, "compile": False, "cuda_graphs": False}
    assert (mcsd_generate(OmegaConf.create({"ckpt": str(out), **generation}))
            == mcsd_generate(OmegaConf.create({"ckpt": str(trained_run), **generation})))
    eval_run = tmp_path / "eval"
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        evaluate(compose("eval", overrides=[f"ckpt={trained_run}", "tasks=local", "limit=8", "batch_size=4",
                                            "wandb.enabled=false", f"paths.output_dir={eval_run}"]))
    lm_eval = subprocess.run(
        [command("lm_eval"), "--model", "hf", "--model_args",
         f"pretrained={out},trust_remote_code=True", "--tasks", "mcsd_local_mc,mcsd_local_ppl", "--include_path",
         str(eval_run / "local_tasks"), "--limit", "8", "--batch_size", "4", "--device", "cpu", "--output_path",
         str(tmp_path / "lm_eval")], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**{key: value for key, value in offline.items() if value}, "PATH": "/usr/bin:/bin",
             "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert lm_eval.returncode == 0, lm_eval.stderr[-3000:]
    (cli_file,) = (tmp_path / "lm_eval").rglob("results_*.json")
    ours = json.loads((eval_run / "results.json").read_text())["results"]
    theirs = json.loads(cli_file.read_text())["results"]
    for task, metric in [("mcsd_local_mc", "acc,none"), ("mcsd_local_mc", "acc_norm,none"),
                         ("mcsd_local_ppl", "bits_per_byte,none"), ("mcsd_local_ppl", "word_perplexity,none")]:
        assert theirs[task][metric] == ours[task][metric]  # lm-eval's own CLI on the export = mcsd-eval
    before = (out / "model.safetensors").read_bytes()
    # Refused before anything is written (the command prints these MCSDErrors in one line, as the push below).
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr("huggingface_hub.constants.HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "tokens"))
    refusals = {
        "is not a .ckpt file": ["ckpt=" + str(out / "README.md"), f"out={tmp_path / 'other'}"],
        "exists (an earlier transformers export): choose a new folder, or overwrite=true": [f"ckpt={trained_run}", f"out={out}"],
        "holds the model being exported": [f"ckpt={trained_run}", f"out={trained_run.parent}", "overwrite=true"],
        "needs a Hugging Face token": [f"ckpt={trained_run}", f"out={tmp_path / 'other'}", "push_to_hub=me/model"],
    }
    for message, arguments in refusals.items():
        with initialize_config_module("mcsd.conf", version_base="1.3"):
            cfg = compose("export", overrides=arguments)
        with pytest.raises((MCSDError, FileNotFoundError), match=re.escape(message)):
            export(cfg)
    assert (out / "model.safetensors").read_bytes() == before and not (tmp_path / "other").exists()
    pushed = run_here("mcsd-export", f"ckpt={trained_run}", f"out={out}", "overwrite=true", "push_to_hub=me/model",
                      cwd=tmp_path, env={**offline, "HF_TOKEN": "hf_not_a_real_token"})
    errors = [line for line in pushed.stderr.splitlines() if line.startswith("mcsd-export: error:")]
    assert pushed.returncode == 2 and len(errors) == 1, pushed.stderr[-2000:]
    assert "the Hugging Face Hub is unreachable from here: the export is in" in errors[0]
    assert (out / "model.safetensors").read_bytes() == before


def test_overwrite_replaces_only_an_earlier_export(trained_run: Path, tmp_path: Path) -> None:
    """overwrite=true replaces an earlier export whole; a folder that holds anything an export does
    not write (a user's file, a subfolder) or lacks the export's code file is left untouched."""
    def run(out: Path) -> Path:
        with initialize_config_module("mcsd.conf", version_base="1.3"):
            return export(compose("export", overrides=[f"ckpt={trained_run}", f"out={out}", "overwrite=true"]))

    earlier = tmp_path / "earlier"
    run(earlier)
    (earlier / "model.safetensors").write_bytes(b"stale")  # replaced by the new export's weights
    (earlier / "README.md").write_text("an older card\n")
    run(earlier)
    assert (earlier / "model.safetensors").read_bytes() != b"stale" and "an older card" not in (earlier / "README.md").read_text()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["earlier"]  # nothing left beside it
    for name, make in [("with-notes", lambda folder: (folder / "notes.txt").write_text("mine\n")),
                       ("with-subfolder", lambda folder: (folder / "data").mkdir()),
                       ("without-code", lambda folder: (folder / REMOTE_CODE_FILE).unlink())]:
        folder = tmp_path / name
        shutil.copytree(earlier, folder)
        make(folder)
        before = sorted(path.relative_to(folder) for path in folder.rglob("*"))
        with pytest.raises(MCSDError, match="choose a new or empty folder"):
            run(folder)
        assert sorted(path.relative_to(folder) for path in folder.rglob("*")) == before
