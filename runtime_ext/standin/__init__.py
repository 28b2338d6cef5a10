"""The stand-in SGLang server: an SGLang 0.5.23 HTTP server that speaks the same JSON for the routes forerun
uses, backed by a tiny deterministic numpy model over a byte vocabulary instead of SGLang's runtime (which
cannot run on CPU machines).  It is a stand-in, not SGLang: every number it reports can be recomputed from
`ByteModel`.

Who runs it: `forerun bench scaleout` launches it as its simulated GPU workers
(`python -m forerun.runtime_ext.standin.server`, through `runtime_ext.launch` and FORERUN_SERVER_MODULE), and
the test suite runs it as the server the SGLang server client is tested against.

    module       responsibility
    server       StandInServer: lifecycle, /generate (SGLang's logprob shift, seed rule, sessions, plugin
                 keys), failure injection, the `python -m` entry point
    admission    what SGLang's tokenizer manager refuses before a request runs (a batch: every item before any)
    routes       the HTTP handler: routes, SGLang's status codes and error bodies, failure injection
    byte_model   ByteModel (deterministic byte-vocabulary logits and sampling), its tokenizer, the prefix cache,
                 the decode loop
    stopping     SGLang's stop rules: stop strings, stop_regex, stop ids / EOS, length; when output is sent
    constraints  SGLang's regex / json_schema / ebnf constraints: xgrammar's mask over the byte vocabulary
    detokenizer  SGLang's detokenizer: the response text (special tokens skipped, the matched stop trimmed)
    sessions     sessions, following SGLang's session controller
    stream       server-sent events (/generate with "stream": true)
    responses    the meta_info beside a generation: logprob keys, the output of an abort before the prefill
"""
