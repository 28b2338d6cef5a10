"""The roles of a program (`sgl.system/user/assistant`) on SGLangServerBackend use the chat template SGLang's own
`RuntimeEndpoint` picks: matched by the server's `model_path`, or named by `chat_template_name`."""

from __future__ import annotations

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
