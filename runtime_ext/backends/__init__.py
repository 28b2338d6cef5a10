"""Token-exact SGLang frontend backends: programs' text becomes exact token ids, never re-tokenized text.

    module           responsibility
    sglang_frontend  the one place forerun imports the SGLang frontend
    token_markers    token_ids / sampling_seed / logprob_temperatures markers in program text
    token_exact      TokenExactBackend: program text -> ids, remembered generations, select
    embedded         EmbeddedBackend: the frontend backend on the embedded engine
    server_config    ServerConfig (transport settings), retried statuses, the gateway's routing header
    server_wire      request bodies and response checks of SGLang 0.5.23's /generate
    server_sessions  SessionMirror: the client's copy of the server's session histories
    server_stream    streamed /generate (rows of streaming PreSTO) and /abort_request
    server_client    SGLangServerClient: the SGLang server as a forerun Engine (HTTP, two-pass log p0),
                     SGLangServerError
    server           SGLangServerBackend: the frontend backend on the server client
    sglang_plugin    the server-side sampler plugin (log p0, entropy, log q at extra temperatures)
"""
