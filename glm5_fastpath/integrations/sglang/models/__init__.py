"""SGLANG_EXTERNAL_MODEL_PACKAGE seam, for SGLang releases without the `sglang.srt.plugins` group (0.5.14).

Usage (any SGLang with the external model package, e.g. 0.5.14 on the H200 test machine):

    GLM5_FASTPATH=1 \\
    SGLANG_EXTERNAL_MODEL_PACKAGE=glm5_fastpath.integrations.sglang.models \\
    python -m sglang.launch_server --model-path /path/to/GLM-5-FP8 ...

SGLang imports every module of this package and registers its `EntryClass` by class name, so
`glm5_moe_dsa.GlmMoeDsaForCausalLM` (a subclass of SGLang's own class, same name) replaces the stock
class for `architectures: ["GlmMoeDsaForCausalLM"]`; the MTP draft class is not replaced. It calls
`install_model()` once after the weights are loaded (`post_load_weights`, which both the real loader
and `--load-format dummy` run), when GLM5_FASTPATH=1. There is no ModelRunner at that point, so only
the per-layer seams are wrapped (no per-step metrics) and the TP size comes from SGLang's parallel state.
The environment variables are inherited by the spawned scheduler processes. Without GLM5_FASTPATH=1
the subclass behaves exactly like the stock class.

On 0.5.23+ prefer the plugin (`--enable-glm5-fastpath`); do not use both at once.
This __init__ imports nothing from sglang (SGLang skips packages and imports the modules).
"""
