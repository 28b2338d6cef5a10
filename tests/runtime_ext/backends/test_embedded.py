"""EmbeddedBackend runs @sgl.function programs token-exactly on the embedded engine."""

from __future__ import annotations

import threading

import pytest

from forerun.runtime_ext.backends.embedded import EmbeddedBackend
from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.protocol import SamplingParams
from forerun.runtime_ext.backends.sglang_frontend import function, gen, select, sgl
from forerun.runtime_ext.backends.token_markers import sampling_seed, token_ids
from forerun.testing.test_modules import sibling


class RecordingEngine(EmbeddedEngine):
    """Records the exact ids every request reaches the engine with."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: list[tuple[int, ...]] = []
        self.outputs: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._seen_lock = threading.Lock()

    def generate(self, input_ids, params, **kw):
        with self._seen_lock:
            self.seen.append(tuple(input_ids))
        out = super().generate(input_ids, params, **kw)
        with self._seen_lock:
            self.outputs[tuple(input_ids)] = out.output_ids
        return out


@pytest.fixture(scope="module")
def backend():
    eng = RecordingEngine(load_model("tiny"), EngineConfig(batch_window_ms=20))
    yield EmbeddedBackend(eng)
    eng.close()


@function
def branches(s, root, cuts):
    forks = s.fork(len(cuts))
    for f, c in zip(forks, cuts):
        f += token_ids(root[:c]) + sampling_seed(1000 + c)
        f += gen("suffix", max_tokens=6, temperature=1.0, ignore_eos=True, return_logprob=True)
    forks.join()


def test_fork_branches_reach_the_engine_with_exact_cut_ids(backend):
    eng = backend.engine
    root = list(eng.tokenizer.encode("héllo wörld ☃ and more text"))
    cuts = [2, 3, 9, 17]  # 2 and 9 cut inside a multi-byte character
    assert "\ufffd" in eng.tokenizer.decode(root[:2]) and "\ufffd" in eng.tokenizer.decode(root[:9])
    eng.seen.clear()
    before = eng.stats()["decode_steps"]
    state = branches.run(root=root, cuts=cuts, backend=backend)
    assert sorted(eng.seen) == sorted(tuple(root[:c]) for c in cuts)
    assert eng.stats()["decode_steps"] - before < 4 * 6  # the 4 branches shared batched decode steps
    # each branch equals a direct engine call with the same ids and seed
    for c in cuts:
        direct = EmbeddedEngine.generate(eng, root[:c], SamplingParams(max_new_tokens=6, seed=1000 + c, ignore_eos=True))
        assert eng.outputs[tuple(root[:c])] == direct.output_ids
    assert state is not None


def test_gen_meta_info_and_multi_turn_exactness(backend):
    eng = backend.engine

    @function
    def two_gens(s):
        s += token_ids([104, 195]) + sampling_seed(5)
        s += gen("a", max_tokens=5, ignore_eos=True, return_logprob=True, top_logprobs_num=2)
        s += gen("b", max_tokens=4, ignore_eos=True)

    eng.seen.clear()
    st = two_gens.run(backend=backend)
    st.sync()  # both gens done before the test ends (else "b" may still run when the fixture closes the engine)
    meta = st.get_meta_info("a")
    assert meta["completion_tokens"] == 5 and len(meta["output_token_logprobs"]) == 5
    assert len(meta["output_top_logprobs"]) == 5 and len(meta["output_token_entropy"]) == 5
    first_out = [e[1] for e in meta["output_token_logprobs"]]
    # the second gen continues from the exact ids (prompt + generated ids), even if they are not valid UTF-8
    assert eng.seen[1] == (104, 195, *first_out)


LOGPROB_KEYS = {"output_token_logprobs", "output_token_logprobs_length", "output_top_logprobs", "input_token_logprobs",
                "input_top_logprobs", "output_token_logp0", "output_token_entropy"}
"""SGLang's logprob keys (tokenizer_manager.add_logprob_to_meta_info) and forerun's per-token extras."""


def test_logprobs_are_in_meta_info_only_when_asked(backend):
    """SGLang 0.5.23's tokenizer manager adds the logprob keys to a response's meta_info only under return_logprob
    (pinned below); a gen without it (top_logprobs_num set or not, streamed or not) gets none of them here either,
    and one with it gets its entries and SGLang's output_token_logprobs_length."""
    src = sibling(__file__, "sglang_source")
    manager = "srt/managers/tokenizer_manager.py"
    assert src.line(manager, 2520) == 'if getattr(state.obj, "return_logprob", False):'
    assert src.line(manager, 2521) == "self.convert_logprob_style("

    @function
    def gens(s, asked):
        s += sampling_seed(8) + "Hi" + gen("a", max_tokens=4, ignore_eos=True, top_logprobs_num=2, return_logprob=asked)

    for stream in (False, True):
        st = gens.run(asked=None, backend=backend, stream=stream)
        st.sync()
        meta = st.get_meta_info("a")
        assert meta["completion_tokens"] == 4 and not LOGPROB_KEYS & set(meta), (stream, sorted(meta))
        st = gens.run(asked=True, backend=backend, stream=stream)
        st.sync()
        meta = st.get_meta_info("a")
        assert meta["completion_tokens"] == 4 and meta["output_token_logprobs"] and meta["output_top_logprobs"]
        assert meta["output_token_logprobs_length"] == 4  # add_logprob_to_meta_info sets it (streamed: the last
        # chunk's count of all tokens so far)


def test_select_and_run_batch(backend):
    @function
    def pick(s, q):
        s += q + " answer: " + select("ans", choices=["yes", "no", "maybe"])

    st = pick.run(q="Is it?", backend=backend)
    assert st["ans"] in ("yes", "no", "maybe")
    states = pick.run_batch([{"q": "A?"}, {"q": "B?"}, {"q": "C?"}], backend=backend)
    assert all(s["ans"] in ("yes", "no", "maybe") for s in states)


def test_select_unconditional_likelihood_normalized_scores_each_choice_alone(backend):
    """SGLang's RuntimeEndpoint scores each choice's tokens alone for this method; the oracle is a plain transformers
    forward of a second copy of the tiny model over those tokens."""
    import torch

    @function
    def pick(s):
        s += "Answer yes or no: " + select("a", choices=["yes", "no way", "maybe"],
                                            choices_method=sgl.unconditional_likelihood_normalized)

    st = pick.run(backend=backend)
    assert st.error() is None
    meta = st.get_meta_info("a")
    model = load_model("tiny").model
    scores = []
    for cond, uncond in zip(meta["input_token_logprobs"], meta["unconditional_token_logprobs"]):
        ids = [int(e[1]) for e in cond]
        assert [int(e[1]) for e in uncond] == ids and uncond[0][0] is None
        with torch.inference_mode():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        expect = [float(logp[j - 1, ids[j]]) for j in range(1, len(ids))]
        assert [e[0] for e in uncond[1:]] == pytest.approx(expect, abs=1e-4)
        scores.append(sum(e[0] for e in cond) / len(ids) - sum(expect) / len(ids))
    assert st["a"] == ["yes", "no way", "maybe"][max(range(3), key=lambda i: scores[i])]


@pytest.mark.filterwarnings("ignore:Error in stream_executor")  # the interpreter's own report of the error
def test_a_program_with_an_image_gets_a_clear_error(backend, tmp_path):
    (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n")

    @function
    def look(s):
        s += sgl.user(sgl.image(str(tmp_path / "x.png")) + "What is it?")
        s += sgl.assistant(gen("x", max_tokens=2))

    st = look.run(backend=backend)
    assert isinstance(st.error(), NotImplementedError) and "sgl.image" in str(st.error())


@pytest.mark.filterwarnings("ignore:Error in stream_executor")
def test_a_program_with_a_video_gets_an_error_that_names_video(backend, tmp_path, monkeypatch):
    """SGLang's interpreter keeps a video in `images_` as it does an image (interpreter.py `_execute_video`): the
    refusal must name sgl.video, not only sgl.image.  Frame extraction (cv2) is replaced by a fixed string."""
    from sglang.lang import interpreter

    monkeypatch.setattr(interpreter, "encode_video_base64", lambda path, num_frames: "AAAA")

    @function
    def watch(s):
        s += sgl.user(sgl.video(str(tmp_path / "x.mp4"), 2) + "What happens?")
        s += sgl.assistant(gen("x", max_tokens=2))

    st = watch.run(backend=backend)
    assert isinstance(st.error(), NotImplementedError) and "sgl.video" in str(st.error())


@pytest.mark.filterwarnings("ignore:Error in stream_executor")
def test_a_sampled_select_is_refused_as_sglangs_runtime_endpoint_refuses_it(backend):
    """SGLang's RuntimeEndpoint.select asserts temperature <= 1e-5; forerun ran such a select greedily, silently."""
    @function
    def pick(s, tau):
        s += "Answer: " + sgl.select("a", choices=["yes", "no"], temperature=tau)

    assert pick.run(tau=0.0, backend=backend)["a"] in ("yes", "no")
    st = pick.run(tau=0.7, backend=backend)
    assert isinstance(st.error(), ValueError) and "temperature 0.7" in str(st.error())


def test_chat_template_and_backend_info(backend):
    @function
    def chat(s):
        s += sgl.user("hi")
        s += sgl.assistant(gen("reply", max_tokens=3, ignore_eos=True))

    st = chat.run(backend=backend)
    assert st.text().startswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert backend.get_model_name() == "tiny"
    assert backend.get_server_info()["engine"] == "forerun-embedded"
    backend.flush_cache()


@function
def other_program(s, k):
    """Another program's request on the same backend (as another thread would send it): one more LRU entry."""
    s += sampling_seed(k) + token_ids([5, 6, 7, k])
    s += gen("x", max_tokens=2, temperature=1.0)


QUESTION = "Question: what is it?\nAnswer:"


def first_gen_then_others(s, seed: int, backend, others: int) -> None:
    """In a program: QUESTION, gen "a" (12 tokens), then `others` other programs' requests on `backend`, as other
    threads would send them between this program's gens."""
    s += sampling_seed(seed) + QUESTION
    s += gen("a", max_tokens=12, temperature=1.0, return_logprob=True)
    s["a"]  # the first gen has run
    for k in range(others):
        other_program.run(k=k, backend=backend).sync()


def small_memory(backend, size):
    """(engine, a backend on it remembering `size` generations, QUESTION's ids): the remembered-ids tests' setup."""
    return backend.engine, EmbeddedBackend(backend.engine, memory_size=size), list(backend.engine.tokenizer.encode(QUESTION))


def test_a_program_continues_from_its_own_ids_however_much_other_work_ran_between_its_gens(backend):
    """A second gen must extend the exact ids of the program's first one.  Those ids were found only in the
    backend's shared memory of generated text (an LRU of `memory_size` entries): requests of other programs on the
    backend in between (other threads: a sampler's calls add one entry per request) evicted them, the second
    gen's prompt was the first gen's text re-tokenized, and its output changed with what else ran (on the tiny
    model 5 of 6 seeds).  Oracle: the ids the engine saw for the second gen begin with the first gen's prompt
    ids and its output ids, as the engine reported them."""
    eng, small, prompt_ids = small_memory(backend, 4)

    @function
    def two_turns(s, seed):
        first_gen_then_others(s, seed, small, 6)
        s += "\nAgain:"
        s += gen("b", max_tokens=4, temperature=1.0, return_logprob=True)

    for seed in range(4):
        eng.seen.clear()
        st = two_turns.run(seed=seed, backend=small)
        st.sync()
        assert st.error() is None
        first = prompt_ids + [e[1] for e in st.get_meta_info("a")["output_token_logprobs"]]
        second = [ids for ids in eng.seen if len(ids) > len(first) and ids[:len(prompt_ids)] == tuple(prompt_ids)]
        assert len(second) == 1 and list(second[0][:len(first)]) == first, seed


def test_fork_children_continue_from_the_parents_ids_however_much_other_work_ran_before_they_gen(backend):
    """A fork child is a new program stream, so the parent's own kept generation was not its: once other programs'
    requests evicted the parent's generation from the shared LRU, each child's first gen re-tokenized the parent's
    text (the tiny model's outputs hold bytes that are not UTF-8, spelled U+FFFD, which re-encode as other ids).
    Oracle: the ids the engine saw for each child's gen begin with the parent gen's prompt ids and output ids, as
    the engine reported them."""
    eng, small, prompt_ids = small_memory(backend, 2)

    @function
    def forked(s, seed):
        first_gen_then_others(s, seed, small, 4)
        children = s.fork(2)
        for child in children:
            child += gen("b", max_tokens=3, temperature=1.0)
        children.join()

    checked = 0
    for seed in range(6):
        eng.seen.clear()
        st = forked.run(seed=seed, backend=small)
        st.sync()
        assert st.error() is None
        out_ids = [e[1] for e in st.get_meta_info("a")["output_token_logprobs"]]
        if any(t in eng.tokenizer.all_special_ids for t in out_ids):
            continue  # a special token inside the text: documented as not remembered (`_remember_generation`)
        first = prompt_ids + out_ids
        second = [ids for ids in eng.seen if len(ids) > len(prompt_ids) and ids[:len(prompt_ids)] == tuple(prompt_ids)
                  and list(ids) != prompt_ids]
        assert len(second) == 2 and all(list(ids[:len(first)]) == first for ids in second), seed
        checked += 1
    assert checked >= 3


def test_a_program_that_starts_with_a_gen_fails_clearly_on_a_model_without_bos(backend):
    """The tiny model's tokenizer adds no BOS, so a program with no text before its first gen has no prompt ids;
    the error used to be the engine's bare "empty prompt (input_ids is empty)"."""
    assert list(backend.engine.tokenizer.encode("")) == []

    @function
    def starts_with_a_gen(s):
        s += gen("x", max_tokens=2)

    error = str(starts_with_a_gen.run(backend=backend).error())
    assert "no text before its first gen" in error and "start the program with some text" in error


def test_a_chat_template_can_be_named_as_on_the_server_backend(backend):
    """EmbeddedBackend took no template name (SGLangServerBackend does): a local model folder whose path SGLang
    does not recognize could only run under the guessed template.  An unknown name lists SGLang's registered ones."""
    named = EmbeddedBackend(backend.engine, chat_template_name="llama-2-chat")
    assert named.chat_template is sgl.lang.chat_template.get_chat_template("llama-2-chat")
    assert backend.chat_template.name == "chatml"  # the tiny model speaks <|im_start|>
    with pytest.raises(ValueError, match="unknown chat template 'no-such'.*chatml.*llama-2-chat"):
        EmbeddedBackend(backend.engine, chat_template_name="no-such")
