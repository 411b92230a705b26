"""vl/bench/vision.py on a tiny tower: the rows, the accuracy checks and the FLOP count it reports; the llama.cpp rows
on a stand-in that reads the written checkpoint back (llama.cpp itself is not built in the tests)."""

import json
import subprocess

import numpy as np
import pytest
import torch

import vl
from vl.bench import llama_cpp_mtmd, vision
from vl.config import RADIO_DEFAULT_NORM as NORM


def test_tower_flops_counts_every_product_and_attention():
    dims = (64, 2, 4, 256)  # dim, depth, heads, mlp
    rows, n = 4 + 8, 4  # a 32-px tile of 16-px patches: 4 patches, 8 prefix rows
    embed = 2 * n * 3 * 16 * 16 * 64
    block = 2 * rows * 64 * (3 * 64 + 64 + 2 * 256) + 4 * rows * rows * 64
    projector = 2 * (n // 4) * (4 * 64 * 32 + 32 * 16)
    assert vision.tower_flops(dims, 3, tile=32, prefix=8, proj_hidden=32, llm_dim=16) == 3 * (embed + 2 * block
                                                                                               + projector)
    # the released size: ~1.3 TFLOP of tower products, ~0.18 of attention, ~0.11 of projector per 512-px tile
    assert 1.55e12 < vision.tower_flops((1280, 32, 16, 5120), 1) < 1.62e12


def test_tiny_run_reports_every_row_and_agrees_with_transformers():
    r = vision.run(torch.bfloat16, threads=1, rounds=1, page_tiles=2, micro_batch=1, tower="vit_tiny_patch16_224",
                   tile=64, proj_hidden=64, llm_dim=32)
    assert set(r["rows"]) == {"ours", "ours_packed", "ours_plain", "transformers"}
    for row in r["rows"].values():
        assert row["median_s"] > 0 and row["ratio_vs_transformers"] > 0 and 0 < row["pct_of_gemm_peak"]
    assert r["rows"]["transformers"]["ratio_vs_transformers"] == 1.0
    assert r["gemm_peak_tflops"] > 0 and len(r["gemm_tflops"]) == 4
    scale = r["output_scale"]
    assert r["max_abs_diff"]["ours_plain_vs_transformers"] <= 0.02 * scale  # the same maths, the same bf16 steps
    assert r["max_abs_diff"]["ours_vs_transformers"] <= 0.05 * scale
    assert r["max_abs_diff"]["ours_vs_ours_packed"] == 0.0  # packing keeps the weights' values
    assert set(r["max_abs_diff_vs_fp32"]) == {"ours", "ours_packed", "ours_plain", "transformers"}
    assert set(r["page"]) == {"micro_batch_1", "micro_batch_2"}
    text = vision.format_result(r)
    assert "| ours |" in text and "GEMM peak" in text and r["fused_path"] in text and r["attention"] in text


def test_fp32_run_keeps_the_modules_and_transformers_bits():
    r = vision.run(torch.float32, threads=1, rounds=1, page_tiles=0, tower="vit_tiny_patch16_224", tile=32,
                   proj_hidden=64, llm_dim=32)
    assert "float32" in r["fused_path"]  # the fused path serves bf16 only
    assert r["max_abs_diff"]["ours_vs_transformers"] == 0.0
    assert "page" not in r and "max_abs_diff_vs_fp32" not in r



class LoadedBack:
    """Stands in for a llama.cpp tree: "converting" keeps the checkpoint directory the bench wrote, and "encoding"
    loads it with `vl.load_pretrained` and runs the image bytes, normalised with the checkpoint's own mean and std,
    through its tower and projector. So the written checkpoint, the image bytes and the comparison are checked end
    to end; llama.cpp's own figures come from `vl bench --vision-tower bf16 --llama-cpp DIR`, not from here."""

    def __init__(self):
        self.calls = []

    def build_tool(self, work):
        return work / "mtmd_encode"

    def convert(self, hf_dir, outtype, dst):
        self.hf_dir = hf_dir
        dst.write_bytes(b"GGUF")
        return dst

    def encode(self, tool, gguf, rgb, *, threads, repeats, width, work):
        model = vl.load_pretrained(self.hf_dir, dtype=torch.float32)
        cfg = model.config
        x = torch.from_numpy(rgb).permute(2, 0, 1)[None].float() / 255
        x = (x - torch.tensor(cfg.norm_mean).view(1, 3, 1, 1)) / torch.tensor(cfg.norm_std).view(1, 3, 1, 1)
        with torch.inference_mode():
            emb = model.encode_tiles(x)[0]
        assert emb.shape[-1] == width
        self.calls.append((gguf.name, threads, repeats))
        return [0.5] * repeats, emb.numpy()


def test_llama_cpp_rows_compare_the_same_weights_and_bytes():
    fake = LoadedBack()
    r = vision.run(torch.bfloat16, threads=1, rounds=2, page_tiles=0, tower="vit_tiny_patch16_224", tile=64,
                   proj_hidden=64, llm_dim=32, llama_cpp=fake, llama_cpp_types=("f16", "q8_0"))
    lc = r["llama_cpp"]
    assert fake.calls == [("mmproj-f16.gguf", 1, 2), ("mmproj-q8_0.gguf", 1, 2)]
    assert set(lc["types"]) == {"f16", "q8_0"}
    row = lc["types"]["f16"]
    assert row["median_s"] == 0.5 and row["tokens"] == (64 // 16 // 2) ** 2
    assert row["ours_vs_it"] == round(0.5 / r["rows"]["ours"]["median_s"], 3)
    # the checkpoint read back in fp32 is the bf16 tower's weights: against the fp32 tower (rounded to bf16) it is
    # far closer than the bf16 run itself, and the bf16 run is as far from it as from the fp32 tower
    scale = lc["embedding_scale"]
    assert row["max_abs_diff"]["fp32"] < 0.05 * scale
    assert abs(row["mean_abs_diff"]["ours"] - lc["ours_vs_fp32_mean_abs_diff"]) < 0.5 * lc["ours_vs_fp32_mean_abs_diff"]
    # the position table llama.cpp's converter resamples with align_corners=True differs from the model's
    assert lc["pos_table_max_abs_diff"] > 0 and lc["pos_table_scale"] > 0
    text = vision.format_result(r)
    assert "| f16 (0 MiB) | 0.5 |" in text and "align_corners=True" in text


def test_the_written_checkpoint_is_a_nano_v2_vl_directory_with_the_towers_weights(tmp_path):
    ours, proj, _, _, (rgb, x) = vision.build(torch.float32, "vit_tiny_patch16_224", 64, 64, 32)
    path = llama_cpp_mtmd.write_checkpoint(ours, proj, tmp_path / "hf", timm_name="vit_tiny_patch16_224", tile=64,
                                           **NORM)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["NemotronH_Nano_VL_V2"] and config["force_image_size"] == 64
    assert json.loads((path / "preprocessor_config.json").read_text())["image_mean"] == NORM["norm_mean"]
    model = vl.load_pretrained(path, dtype=torch.float32)
    for name, t in ours.state_dict().items():
        assert torch.equal(model.vision.state_dict()[name], t), name
    for name, t in proj.state_dict().items():
        assert torch.equal(model.projector.state_dict()[name], t), name
    assert rgb.shape == (64, 64, 3) and rgb.dtype == np.uint8 and x.shape == (1, 3, 64, 64)


@pytest.mark.parametrize("args, message", [
    (["--llama-cpp", "{tmp}"], "no libmtmd.so"),
    (["--llama-cpp-mmproj", "q4_0"], "--llama-cpp-mmproj: expected a comma list of f16, bf16, q8_0, f32"),
])
def test_vl_bench_refuses_a_tree_without_libmtmd_and_unknown_types_before_any_work(tmp_path, capsys, args, message):
    from vl.bench.run import main

    with pytest.raises(SystemExit) as e:
        main(["--vision-tower", "bf16", *[a.format(tmp=tmp_path) for a in args]])
    assert e.value.code == 2 and message in capsys.readouterr().err


STUB_HEADER = r"""
#pragma once
#include <stdbool.h>
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
struct llama_model;
typedef struct mtmd_context mtmd_context;
typedef struct mtmd_bitmap mtmd_bitmap;
typedef struct mtmd_input_chunk mtmd_input_chunk;
typedef struct mtmd_input_chunks mtmd_input_chunks;
typedef struct mtmd_input_text { const char* text; size_t text_len; bool add_special; bool parse_special; } mtmd_input_text;
typedef struct mtmd_input_part { const mtmd_input_text* text; const mtmd_bitmap* bitmap; } mtmd_input_part;
enum mtmd_input_chunk_type { MTMD_INPUT_CHUNK_TYPE_TEXT, MTMD_INPUT_CHUNK_TYPE_IMAGE, MTMD_INPUT_CHUNK_TYPE_AUDIO };
struct mtmd_context_params { bool use_gpu; bool print_timings; int n_threads; bool warmup; };
struct mtmd_context_params mtmd_context_params_default(void);
mtmd_context* mtmd_init_from_file(const char* fname, const struct llama_model* text_model,
                                  struct mtmd_context_params params);
void mtmd_free(mtmd_context* ctx);
mtmd_bitmap* mtmd_bitmap_init(unsigned nx, unsigned ny, const unsigned char* data);
void mtmd_bitmap_free(mtmd_bitmap* bitmap);
mtmd_input_chunks* mtmd_input_chunks_init(void);
size_t mtmd_input_chunks_size(const mtmd_input_chunks* chunks);
const mtmd_input_chunk* mtmd_input_chunks_get(const mtmd_input_chunks* chunks, size_t idx);
void mtmd_input_chunks_free(mtmd_input_chunks* chunks);
enum mtmd_input_chunk_type mtmd_input_chunk_get_type(const mtmd_input_chunk* chunk);
size_t mtmd_input_chunk_get_n_tokens(const mtmd_input_chunk* chunk);
int mtmd_tokenize_from_parts(const mtmd_context* ctx, mtmd_input_chunks* output, const mtmd_input_part* const* parts,
                             size_t n_parts, bool add_special);
int mtmd_encode_chunk(mtmd_context* ctx, const mtmd_input_chunk* chunk);
float* mtmd_get_output_embd(mtmd_context* ctx);
#ifdef __cplusplus
}
#endif
"""

# A stand-in libmtmd: one image chunk of 4 tokens whose embedding row t holds (t + 1) * the image's first byte and
# the thread count, so the harness's arguments, image bytes and output file are all checked.
STUB_LIBRARY = r"""
#include "mtmd.h"
#include <stdlib.h>
struct mtmd_context { int threads; float out[4 * 3]; unsigned char first; };
struct mtmd_bitmap { unsigned char first; };
struct mtmd_input_chunk { int n; };
struct mtmd_input_chunks { struct mtmd_input_chunk one; int size; };
struct mtmd_context_params mtmd_context_params_default(void) { struct mtmd_context_params p = {true, true, 4, true}; return p; }
mtmd_context* mtmd_init_from_file(const char* f, const struct llama_model* m, struct mtmd_context_params p) {
  mtmd_context* c = (mtmd_context*)calloc(1, sizeof(mtmd_context)); c->threads = p.n_threads; return m ? NULL : c; }
void mtmd_free(mtmd_context* c) { free(c); }
mtmd_bitmap* mtmd_bitmap_init(unsigned nx, unsigned ny, const unsigned char* d) {
  mtmd_bitmap* b = (mtmd_bitmap*)malloc(sizeof(mtmd_bitmap)); b->first = d[0]; return b; }
void mtmd_bitmap_free(mtmd_bitmap* b) { free(b); }
mtmd_input_chunks* mtmd_input_chunks_init(void) { return (mtmd_input_chunks*)calloc(1, sizeof(mtmd_input_chunks)); }
size_t mtmd_input_chunks_size(const mtmd_input_chunks* c) { return c->size; }
const mtmd_input_chunk* mtmd_input_chunks_get(const mtmd_input_chunks* c, size_t i) { return &c->one; }
void mtmd_input_chunks_free(mtmd_input_chunks* c) { free(c); }
enum mtmd_input_chunk_type mtmd_input_chunk_get_type(const mtmd_input_chunk* c) { return MTMD_INPUT_CHUNK_TYPE_IMAGE; }
size_t mtmd_input_chunk_get_n_tokens(const mtmd_input_chunk* c) { return c->n; }
int mtmd_tokenize_from_parts(const mtmd_context* ctx, mtmd_input_chunks* out, const mtmd_input_part* const* parts,
                             size_t n, bool add_special) {
  ((mtmd_context*)ctx)->first = parts[0]->bitmap->first; out->one.n = 4; out->size = 1; return 0; }
int mtmd_encode_chunk(mtmd_context* c, const mtmd_input_chunk* chunk) {
  for (int t = 0; t < 4; ++t) { c->out[3 * t] = (t + 1) * c->first; c->out[3 * t + 1] = c->threads; c->out[3 * t + 2] = -1; }
  return 0; }
float* mtmd_get_output_embd(mtmd_context* c) { return c->out; }
"""


def test_the_timing_program_builds_against_a_tree_and_returns_what_the_library_encoded(tmp_path):
    tree = tmp_path / "llama.cpp"
    for d in ("tools/mtmd", "include", "ggml/include", "build/bin"):
        (tree / d).mkdir(parents=True)
    (tree / "tools/mtmd/mtmd.h").write_text(STUB_HEADER)
    (tree / "convert_hf_to_gguf.py").write_text("raise SystemExit('not run here')\n")
    stub = tmp_path / "stub.c"
    stub.write_text(STUB_LIBRARY)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-I{tree}/tools/mtmd", str(stub), "-o",
                    str(tree / "build/bin/libmtmd.so")], check=True)
    mtmd = llama_cpp_mtmd.Mtmd(tree)
    tool = mtmd.build_tool(tmp_path)
    rgb = np.full((8, 6, 3), 7, dtype=np.uint8)
    seconds, emb = mtmd.encode(tool, tmp_path / "x.gguf", rgb, threads=3, repeats=2, width=3, work=tmp_path)
    assert len(seconds) == 2 and all(s >= 0 for s in seconds)
    assert emb.tolist() == [[7 * (t + 1), 3, -1] for t in range(4)]
    with pytest.raises(RuntimeError, match="convert_hf_to_gguf.py --mmproj --outtype f16 failed"):
        mtmd.convert(tmp_path, "f16", tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="mmproj GGUF type"):
        mtmd.convert(tmp_path, "q4_0", tmp_path / "m.gguf")
