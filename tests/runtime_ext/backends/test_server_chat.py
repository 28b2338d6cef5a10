"""Programs on SGLangServerBackend: their roles (`sgl.system/user/assistant`) use the chat template SGLang's own
`RuntimeEndpoint` picks (matched by the server's `model_path`, or named by `chat_template_name`), and a streamed
gen inside `session_params` keeps the session."""

from __future__ import annotations

import pytest

from forerun.runtime_ext.backends.server import SGLangServerBackend
from forerun.runtime_ext.backends.sglang_frontend import sgl
from forerun.runtime_ext.standin.server import StandInServer


@sgl.function
def chat(s):
    s += sgl.system("Be brief.")
    s += sgl.user("hi")
    s += sgl.assistant(sgl.gen("a", max_tokens=2, temperature=0))


def test_a_qwen_instruct_servers_programs_speak_its_chatml():
    with StandInServer(model_path="Qwen/Qwen2.5-1.5B-Instruct") as srv:
        backend = SGLangServerBackend(srv.url, tokenizer=srv.tokenizer)
        text = chat.run(backend=backend).text()
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                           "<|im_start|>assistant\n")


def test_chat_template_name_overrides_the_model_path():
    with StandInServer(model_path="Qwen/Qwen2.5-1.5B-Instruct") as srv:
        backend = SGLangServerBackend(srv.url, tokenizer=srv.tokenizer, chat_template_name="default")
        text = chat.run(backend=backend).text()
    assert text.startswith("SYSTEM:Be brief.\nUSER:hi\nASSISTANT:")


def test_a_streamed_gen_inside_session_params_keeps_the_session():
    """Streams carry no session (the client mirrors non-streamed session requests only): inside
    `backend.session_params` a streamed gen is one plain request with the session, never a stream without it."""
    @sgl.function
    def prog(s):
        s += "Hello"
        s += sgl.gen("x", max_tokens=3, temperature=0)

    with StandInServer() as srv:
        backend = SGLangServerBackend(srv.url, tokenizer=srv.tokenizer)
        sid = backend.open_session(256)
        with backend.session_params({"id": sid}):
            state = prog.run(stream=True, backend=backend)
            text = "".join(state.text_iter("x"))
        bodies = [body for path, body in srv.requests if path == "/generate"]
    assert text == state["x"] and bodies and not any(b.get("stream") for b in bodies)
    assert bodies[0]["session_params"]["id"] == sid


def test_an_unknown_chat_template_name_is_a_value_error_that_lists_the_known_ones():
    with StandInServer(model_path="Qwen/Qwen2.5-1.5B-Instruct") as srv:
        with pytest.raises(ValueError, match="unknown chat template 'chat-ml'.*chatml"):
            SGLangServerBackend(srv.url, tokenizer=srv.tokenizer, chat_template_name="chat-ml")
