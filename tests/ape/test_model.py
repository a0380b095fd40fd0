"""Tests for ``learnable_sparsity.ape.model``: the APE encoder-decoder and the dual-source baseline.

A tiny random BERT (2 layers, hidden 32, 4 heads, feed-forward 64, 16 positions) over a
hand-made WordPiece vocabulary (BERT's five special tokens, letters a–j, their "##" pieces and
"."). Its ``initializer_range`` is 0.2 rather than BERT's 0.02, so that attention scores differ
enough for sparsemax to put exact zeros on real keys.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor, nn
from transformers import BertConfig, BertModel, BertTokenizerFast

from learnable_sparsity.ape.model import (
    MT_SIDE,
    PAD_SIDE,
    SRC_SIDE,
    ApeConfig,
    ApeModel,
    build_ape_model,
    detokenize,
    joint_input,
    segments_and_positions,
    target_ids,
)
from learnable_sparsity.ape.wordpiece import SPECIAL_TOKENS
from learnable_sparsity.core.attention import NORMALIZERS
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.batching import pad
from learnable_sparsity.nmt.search import DecodeSettings, beam_search, translate
from learnable_sparsity.nmt.seq2seq import Seq2Seq
from learnable_sparsity.nmt.training import TrainingSettings, train
from learnable_sparsity.settings import SettingsError, build

torch.set_num_threads(1)

LETTERS = "abcdefghij"
HIDDEN, HEADS, LAYERS = 32, 4, 2
D_HEAD = HIDDEN // HEADS
# fp32 agreement of two computations of the same function that differ only in operation order.
TOL = 1e-5
SENTENCES = [("a b c", "a bd", "a bad"), ("j", "e f", "e f"), ("c . d", "c d", "c . d")]


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizerFast:
    words = [*SPECIAL_TOKENS, *LETTERS, *(f"##{c}" for c in LETTERS), "."]
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(words)})


@pytest.fixture(scope="module")
def bert(tokenizer) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=64,
        max_position_embeddings=16,
        initializer_range=0.2,
        pad_token_id=tokenizer.pad_token_id,
    )
    return BertModel(config, add_pooling_layer=False).eval()


@pytest.fixture(scope="module")
def batch(tokenizer) -> tuple[Tensor, Tensor]:
    """(joint inputs [3, S], tgt_in [3, T]) of SENTENCES, right-padded."""
    joint = pad([joint_input(tokenizer, s, m) for s, m, _ in SENTENCES], tokenizer.pad_token_id)
    targets = [[tokenizer.cls_token_id, *target_ids(tokenizer, pe)] for _, _, pe in SENTENCES]
    return joint, pad(targets, tokenizer.pad_token_id)


def make(bert, tokenizer, seed: int = 1, **fields) -> ApeModel:
    torch.manual_seed(seed)
    fields.setdefault("architecture", "bert")
    return build_ape_model(ApeConfig(**fields), bert, tokenizer).eval()


# --------------------------------------------------------------------------- inputs


def test_segments_and_positions_of_a_padded_joint_input() -> None:
    sep, pad_id = 3, 0
    joint = torch.tensor([[5, 6, 3, 7, 8, 9], [5, 3, 7, 0, 0, 0], [5, 6, 7, 3, 0, 0]])
    segments, positions = segments_and_positions(joint, sep, pad_id)
    assert segments.tolist() == [[0, 0, 0, 1, 1, 1], [0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]]
    assert positions.tolist() == [[0, 1, 2, 0, 1, 2], [0, 1, 0, 0, 0, 0], [0, 1, 2, 3, 0, 0]]
    with pytest.raises(LearnableSparsityError, match="separator 3"):
        segments_and_positions(torch.tensor([[5, 6, 0]]), sep, pad_id)


def test_joint_input_target_ids_and_detokenize(tokenizer) -> None:
    sep = tokenizer.sep_token_id
    src, mt = joint_input(tokenizer, "a bad", "c"), target_ids(tokenizer, "c")
    ids = {w: tokenizer.convert_tokens_to_ids(w) for w in ("a", "b", "##a", "##d", "c")}
    assert src == [ids["a"], ids["b"], ids["##a"], ids["##d"], sep, ids["c"]]
    assert mt == [ids["c"]]
    for text in ("a bad cage .", "j", "bad . head"):
        assert detokenize(tokenizer, target_ids(tokenizer, text)) == text
    special = [tokenizer.cls_token_id, *target_ids(tokenizer, "a bad"), sep, tokenizer.pad_token_id]
    assert detokenize(tokenizer, special) == "a bad"


# --------------------------------------------------------------------------- settings


def test_settings_refuse_contradictions_naming_the_key() -> None:
    with pytest.raises(SettingsError, match=r"^ape\.model\.bert_encoder must be false"):
        build(ApeConfig, {"architecture": "dual_source", "bert_encoder": True}, "ape.model")
    with pytest.raises(SettingsError, match=r"^ape\.model\.sa_tied_encoder must be false"):
        build(ApeConfig, {"architecture": "dual_source", "sa_tied_encoder": True}, "ape.model")
    with pytest.raises(SettingsError, match=r"^attention must be one of softmax"):
        ApeConfig(architecture="bert", attention="relu")
    with pytest.raises(SettingsError, match=r"^ape\.model\.architecture must be one of"):
        build(ApeConfig, {"architecture": "lstm"}, "ape.model")
    with pytest.raises(SettingsError, match=r"unknown keys \['tgt_vocab'\]"):
        build(ApeConfig, {"architecture": "bert", "tgt_vocab": 9}, "ape.model")


def test_decoder_deeper_than_the_encoder_only_without_layerwise_sharing(bert, tokenizer) -> None:
    assert len(make(bert, tokenizer, decoder_layers=3).decoder) == 3
    with pytest.raises(SettingsError, match=r"^decoder_layers must not exceed .* bert_decoder"):
        make(bert, tokenizer, decoder_layers=3, bert_decoder=True)


def test_the_config_takes_the_special_ids_vocabulary_and_positions(bert, tokenizer) -> None:
    model = make(bert, tokenizer)
    config = model.config
    assert (config.pad_id, config.bos_id, config.eos_id) == (0, 2, 3)
    assert (config.tgt_vocab, config.max_positions) == (len(tokenizer), 16)
    assert isinstance(model, Seq2Seq)


# --------------------------------------------------------------------------- initialisation


def _attention_params(attention: nn.Module) -> list[Tensor]:
    """query/key/value/output dense and LayerNorm parameters of a BertAttention."""
    return [
        *(
            p
            for name in ("query", "key", "value")
            for p in getattr(attention.self, name).parameters()
        ),
        *attention.output.parameters(),
    ]


def _ff_params(layer: nn.Module) -> list[Tensor]:
    return [*layer.intermediate.parameters(), *layer.output.parameters()]


def _tied_pairs(model: ApeModel, flag: str) -> list[tuple[Tensor, Tensor]]:
    """(decoder parameter, the parameter it is tied to under ``flag``) for every layer."""
    pairs = []
    for layer, encoder_layer in zip(model.decoder, model.encoder.encoder.layer, strict=True):
        decoder, other = {
            "sa_tied_encoder": (layer.attention, encoder_layer.attention),
            "ca_tied_sa": (layer.crossattention[0], layer.attention),
            "ca_init_sa": (layer.crossattention[0], layer.attention),
        }.get(flag, (None, None))
        if flag == "ff_tied_encoder":
            pairs += zip(_ff_params(layer), _ff_params(encoder_layer), strict=True)
        else:
            pairs += zip(_attention_params(decoder), _attention_params(other), strict=True)
    return pairs


TIES = ("sa_tied_encoder", "ca_tied_sa", "ff_tied_encoder")


@pytest.mark.parametrize("flag", TIES)
def test_tied_parameters_are_the_same_objects_counted_once(bert, tokenizer, flag: str) -> None:
    untied, tied = make(bert, tokenizer), make(bert, tokenizer, **{flag: True})
    pairs = _tied_pairs(tied, flag)
    assert all(a is b for a, b in pairs)
    assert not any(a is b for a, b in _tied_pairs(untied, flag))
    ids = [id(p) for p in tied.parameters()]
    assert len(ids) == len(set(ids))
    assert len(ids) == len(list(untied.parameters())) - len(pairs)


@pytest.mark.parametrize("ca_init_sa", [False, True])  # Table 3.1's rows are cumulative
def test_ca_tied_sa_with_sa_tied_encoder_makes_ca_the_encoder_s(
    bert, tokenizer, ca_init_sa
) -> None:
    model = make(bert, tokenizer, sa_tied_encoder=True, ca_tied_sa=True, ca_init_sa=ca_init_sa)
    for layer, encoder_layer in zip(model.decoder, model.encoder.encoder.layer, strict=True):
        context, encoder = layer.crossattention[0], encoder_layer.attention
        assert all(
            a is b
            for a, b in zip(_attention_params(context), _attention_params(encoder), strict=True)
        )


@pytest.mark.parametrize("flag", TIES)
def test_gradients_reach_a_tied_parameter_from_both_uses(bert, tokenizer, batch, flag) -> None:
    """The gradient with the memory detached (decoder use only) differs from the full one."""
    model = make(bert, tokenizer, **{flag: True})
    joint, tgt_in = batch
    shared = _tied_pairs(model, flag)[0][0]  # layer 0's query weight or intermediate weight

    def gradient(detach_memory: bool) -> Tensor:
        model.zero_grad()
        memory, sides = model.encode(joint)
        memory = memory.detach() if detach_memory else memory
        logits, _ = model.decode(tgt_in, memory, sides)
        logits.logsumexp(-1).sum().backward()
        return shared.grad.clone()

    both, decoder_only = gradient(False), gradient(True)
    assert decoder_only.abs().sum() > 0
    if flag == "ca_tied_sa":  # both uses are in the decoder: SA's and CA's
        model.zero_grad()
        memory, sides = model.encode(joint)
        model.decode(tgt_in, memory, sides)[0].logsumexp(-1).sum().backward()
        assert shared.grad.abs().sum() > 0
    else:
        assert (both - decoder_only).abs().sum() > 0  # the encoder's use


def test_bert_weights_only_where_the_flags_say(bert, tokenizer) -> None:
    scratch = make(bert, tokenizer)
    pretrained = make(bert, tokenizer, bert_encoder=True, bert_decoder=True)
    for name, value in bert.state_dict().items():
        assert torch.equal(pretrained.encoder.state_dict()[name], value), name
        if name.endswith("weight") and "LayerNorm" not in name:
            assert not torch.equal(scratch.encoder.state_dict()[name], value), name
    for model, same in ((scratch, False), (pretrained, True)):
        for layer, bert_layer in zip(model.decoder, bert.encoder.layer, strict=True):
            decoder_weights = [*_attention_params(layer.attention), *_ff_params(layer)]
            bert_weights = [*_attention_params(bert_layer.attention), *_ff_params(bert_layer)]
            for a, b in zip(decoder_weights, bert_weights, strict=True):
                assert a is not b
                if a.ndim == 2:
                    assert torch.equal(a, b) == same
    # the context attention of a BERT decoder is random, not BERT's
    context = _attention_params(pretrained.decoder[0].crossattention[0])
    assert not torch.equal(context[0], _attention_params(bert.encoder.layer[0].attention)[0])


def test_random_weights_follow_the_caller_s_seed(bert, tokenizer) -> None:
    for architecture in ("bert", "dual_source"):
        a, b = (make(bert, tokenizer, seed=5, architecture=architecture) for _ in range(2))
        c = make(bert, tokenizer, seed=6, architecture=architecture)
        assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
        assert not torch.equal(
            a.decoder[0].attention.self.query.weight, c.decoder[0].attention.self.query.weight
        )


@pytest.mark.parametrize("flag", ["ca_init_sa", "bert_decoder"])
def test_copies_are_equal_and_independent(bert, tokenizer, batch, flag: str) -> None:
    model = make(bert, tokenizer, bert_encoder=True, **{flag: True})
    if flag == "ca_init_sa":
        pairs = _tied_pairs(model, flag)
    else:  # decoder SA and FF vs the encoder's, which is BERT's
        pairs = [
            pair
            for layer, encoder_layer in zip(model.decoder, model.encoder.encoder.layer, strict=True)
            for pair in zip(
                [*_attention_params(layer.attention), *_ff_params(layer)],
                [*_attention_params(encoder_layer.attention), *_ff_params(encoder_layer)],
                strict=True,
            )
        ]
    assert all(a is not b and torch.equal(a, b) for a, b in pairs)
    bert_before = {k: v.clone() for k, v in bert.state_dict().items()}
    optimizer = torch.optim.SGD([b for _, b in pairs], lr=0.1)  # only the originals move
    joint, tgt_in = batch
    model(joint, tgt_in).logsumexp(-1).sum().backward()
    optimizer.step()
    assert all(not torch.equal(a, b) for a, b in pairs if b.grad is not None and b.grad.any())
    assert sum(1 for _, b in pairs if b.grad is not None and b.grad.any()) > 0
    with torch.no_grad():
        pairs[0][0].add_(1.0)
    assert not torch.equal(pairs[0][0], pairs[0][1])
    assert all(torch.equal(v, bert.state_dict()[k]) for k, v in bert_before.items())


def test_alphas_per_attention_block(bert, tokenizer) -> None:
    assert make(bert, tokenizer).alphas() == {}
    model = make(bert, tokenizer, attention="entmax_alpha", sa_tied_encoder=True)
    alphas = model.alphas()
    keys = [f"{kind}.layer{i}" for kind in ("encoder.self",) for i in range(LAYERS)]
    keys += [f"decoder.{kind}.layer{i}" for i in range(LAYERS) for kind in ("self", "context")]
    assert sorted(alphas) == sorted(keys)
    assert all(value.shape == (HEADS,) for value in alphas.values())
    assert not torch.equal(alphas["encoder.self.layer0"], alphas["decoder.self.layer0"])
    dual = make(bert, tokenizer, architecture="dual_source", attention="entmax_alpha").alphas()
    assert {"mt_encoder.self.layer1", "decoder.context_mt.layer1"} <= dual.keys()


# --------------------------------------------------------------------------- encoding


def test_dual_source_memory_is_each_side_encoded_alone(bert, tokenizer, batch) -> None:
    model = make(bert, tokenizer, architecture="dual_source")
    joint, _ = batch
    memory, sides = model.encode(joint)
    segments, _ = segments_and_positions(joint, model.config.eos_id, model.config.pad_id)
    assert torch.equal(sides, torch.where(joint != 0, segments + SRC_SIDE, PAD_SIDE))
    for row in range(joint.shape[0]):
        for side, encoder in ((SRC_SIDE, model.encoder), (MT_SIDE, model.mt_encoder)):
            ids = joint[row][sides[row] == side][None]
            alone = encoder(
                input_ids=ids, token_type_ids=torch.full_like(ids, side - SRC_SIDE)
            ).last_hidden_state[0]
            torch.testing.assert_close(memory[row][sides[row] == side], alone, rtol=0, atol=TOL)


def test_sparsemax_encoder_attention_is_the_core_sparsemax(bert, tokenizer, batch) -> None:
    model = make(bert, tokenizer, attention="sparsemax", bert_encoder=True)
    joint, _ = batch
    segments, positions = segments_and_positions(joint, 3, 0)
    real = joint != 0
    inputs = {"input_ids": joint, "token_type_ids": segments, "position_ids": positions}
    out = model.encoder(**inputs, attention_mask=real, output_attentions=True)
    visible = real[:, None, None, :].expand(-1, HEADS, joint.shape[1], -1)
    for probs in out.attentions:
        assert torch.all(probs[~visible] == 0)
        row_sums = probs.sum(-1)[real[:, None, :].expand(-1, HEADS, -1)]
        torch.testing.assert_close(row_sums, torch.ones_like(row_sums), rtol=0, atol=1e-6)
        assert torch.any((probs == 0) & visible)  # zeros on real keys: sparse
    attention = model.encoder.encoder.layer[0].attention.self
    hidden = model.embeddings(**inputs)

    def split(x: Tensor) -> Tensor:
        return x.view(*x.shape[:2], HEADS, D_HEAD).transpose(1, 2)

    scores = split(attention.query(hidden)) @ split(attention.key(hidden)).transpose(-2, -1)
    expected = NORMALIZERS["sparsemax"](scores * D_HEAD**-0.5, mask=visible)
    torch.testing.assert_close(out.attentions[0], expected, rtol=0, atol=TOL)


# --------------------------------------------------------------------------- decoding


DECODING = [
    ({"architecture": "bert"}),
    ({"architecture": "bert", "attention": "entmax15", "bert_encoder": True, "bert_decoder": True}),
    (
        {
            "architecture": "bert",
            "attention": "sparsemax",
            "sa_tied_encoder": True,
            "ca_tied_sa": True,
        }
    ),
    ({"architecture": "dual_source"}),
    ({"architecture": "dual_source", "attention": "entmax15"}),
]


@pytest.mark.parametrize("fields", DECODING, ids=lambda f: "-".join(map(str, f.values())))
def test_incremental_decoding_with_a_beam_reorder_matches_the_full_forward(
    bert, tokenizer, batch, fields
) -> None:
    model = make(bert, tokenizer, **fields)
    joint, tgt_in = batch
    reorder = torch.tensor([2, 0, 0])  # beams follow parents: one dropped, one duplicated
    with torch.no_grad():
        full = model(joint, tgt_in)
        full_reordered = model(joint[reorder], tgt_in[reorder])
        memory, sides = model.encode(joint)
        cache, tokens = None, tgt_in
        for t in range(tgt_in.shape[1]):
            if t == 2:
                cache = cache.reorder(reorder)
                memory, sides, tokens = memory[reorder], sides[reorder], tokens[reorder]
            logits, cache = model.decode(tokens[:, t : t + 1], memory, sides, cache, use_cache=True)
            expected = full if t < 2 else full_reordered
            torch.testing.assert_close(logits[:, 0], expected[:, t], rtol=0, atol=TOL)


@pytest.mark.parametrize("architecture", ["bert", "dual_source"])
def test_beam_search_and_translate_run_on_the_ape_model(
    bert, tokenizer, batch, architecture: str
) -> None:
    model = make(bert, tokenizer, architecture=architecture)
    joint, _ = batch
    out = beam_search(model, joint, beam_size=3, max_len_a=0.0, max_len_b=5)
    assert len(out.tokens) == 3 and all(len(hyp) <= 5 for hyp in out.tokens)
    assert all(
        model.config.pad_id not in hyp and model.config.bos_id not in hyp for hyp in out.tokens
    )
    sources = [joint_input(tokenizer, s, m) for s, m, _ in SENTENCES]
    settings = DecodeSettings(beam_size=3, max_len_a=0.0, max_len_b=5)
    assert translate(model, sources, settings, batch_size=2) == out.tokens


def test_train_lowers_the_loss_of_the_ape_model(bert, tokenizer, tmp_path: Path) -> None:
    """30 updates of the project's training loop on a copy task (pe = mt)."""
    rng = torch.Generator().manual_seed(0)

    def sentence() -> str:
        n = int(torch.randint(1, 4, (), generator=rng))
        return " ".join(LETTERS[int(i)] for i in torch.randint(0, 10, (n,), generator=rng))

    def examples(n: int) -> list[tuple[list[int], list[int]]]:
        triples = [(sentence(), sentence()) for _ in range(n)]
        return [(joint_input(tokenizer, s, m), target_ids(tokenizer, m)) for s, m in triples]

    model = make(bert, tokenizer, bert_encoder=True, bert_decoder=True, ca_init_sa=True).train()
    settings = TrainingSettings(
        max_steps=30,
        max_tokens=160,
        warmup=5,
        peak_lr=3e-3,
        schedule="linear",
        log_every=5,
        validate_every=100,
        checkpoint_every=100,
    )
    history = train(
        model, examples(60), examples(10), settings, checkpoint_dir=tmp_path, variant="ape"
    )
    losses = [row["loss"] for row in history.train]
    assert losses[-1] < losses[0] - 0.5, losses
    assert torch.isfinite(torch.tensor(history.valid[-1]["valid_nll"]))


def test_a_checkpoint_loads_into_the_bare_architecture_with_its_ties(
    bert, tokenizer, batch
) -> None:
    model = make(bert, tokenizer, attention="entmax_alpha", sa_tied_encoder=True, ca_tied_sa=True)
    torch.manual_seed(9)
    bare = ApeModel(model.config, bert.config).eval()
    bare.load_state_dict(model.state_dict())
    joint, tgt_in = batch
    torch.testing.assert_close(bare(joint, tgt_in), model(joint, tgt_in), rtol=0, atol=0)
    assert all(a is b for a, b in _tied_pairs(bare, "ca_tied_sa"))
    assert all(a is b for a, b in _tied_pairs(bare, "sa_tied_encoder"))
