"""llama.cpp's multimodal encoder (libmtmd) as a peer of the vision-tower bench (`vl bench --vision-tower DTYPE
--llama-cpp DIR`, vl/bench/vision.py).

llama.cpp runs the Nano V2 VL tower itself (`tools/mtmd`, projector type `NEMOTRON_V2_VL`): its converter
(`convert_hf_to_gguf.py --mmproj`) writes the RADIO tower and the projector of a `NemotronH_Nano_VL_V2` checkpoint
directory into an "mmproj" GGUF. The bench writes its own random tower in that layout (`write_checkpoint`: our
`save_pretrained`, the hub's names, with a one-layer LLM the converter needs only for its width), converts it to each
GGUF type asked for, and times the encoder through libmtmd's C API with a small program of ours (`TOOL_SOURCE`,
written next to the GGUFs and compiled against DIR's build at run time, as vl/bench/llama_cpp.py writes its
converter shim; the package's own native code is only vl/kernels/csrc): the image as RGB bytes, mtmd's own
preprocessing (a 512 x 512 image is copied, not resized) and `mtmd_encode_chunk`, no text model. The program
writes the embeddings it produced, so the bench also says how far they are from ours and from transformers'.

What llama.cpp's conversion and graph change in the maths (docs/bench_llama_cpp.md, "The vision tower"): the
converter resamples the 128 x 128 position table to 32 x 32 once, bilinearly with `align_corners=True` (RADIO,
transformers and this project resample with `align_corners=False`); the projector's RMSNorm uses eps 1e-6 (the
checkpoints' 1e-5); weights are stored in the GGUF type (f16 by default), activations in float32.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from vl.checkpoint.nano_vl import save_pretrained
from vl.config import LMConfig, VisionConfig, VLConfig
from vl.modeling.random_init import randomize_
from vl.modeling.vlm import NemotronVL

TOOL_SOURCE = r'''// Times llama.cpp's multimodal encoder (libmtmd) on one image and writes what it
// produced, for `vl bench --vision-tower --llama-cpp DIR` (vl/bench/llama_cpp_mtmd.py builds it against DIR's
// libraries).
//
//   mtmd_encode MMPROJ RGB_FILE WIDTH HEIGHT THREADS REPEATS EMBD OUT_F32
//
// RGB_FILE holds WIDTH x HEIGHT x 3 bytes (row-major RGB). The image goes through mtmd's own preprocessing and
// encoder (mtmd_tokenize_from_parts + mtmd_encode_chunk, no text model: only the media chunk is made), REPEATS
// times after one untimed warm-up call. Prints one JSON line: the seconds of each timed call and the image tokens;
// OUT_F32 receives the last call's embeddings (tokens x EMBD float32, row-major; EMBD is the projector's output
// width, which mtmd reports only through a text model).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "mtmd.h"

static int fail(const char* what) {
  std::fprintf(stderr, "mtmd_encode: %s\n", what);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 9) return fail("usage: mtmd_encode MMPROJ RGB_FILE WIDTH HEIGHT THREADS REPEATS EMBD OUT_F32");
  const int width = std::atoi(argv[3]), height = std::atoi(argv[4]);
  const int threads = std::atoi(argv[5]), repeats = std::atoi(argv[6]), n_embd = std::atoi(argv[7]);
  if (width <= 0 || height <= 0 || threads <= 0 || repeats <= 0 || n_embd <= 0) return fail("bad size, count or EMBD");

  std::vector<unsigned char> rgb((size_t)width * height * 3);
  FILE* f = std::fopen(argv[2], "rb");
  if (!f) return fail("cannot open RGB_FILE");
  const size_t got = std::fread(rgb.data(), 1, rgb.size(), f);
  std::fclose(f);
  if (got != rgb.size()) return fail("RGB_FILE is shorter than WIDTH x HEIGHT x 3");

  mtmd_context_params params = mtmd_context_params_default();
  params.use_gpu = false;
  params.print_timings = false;
  params.n_threads = threads;
  params.warmup = false;
  mtmd_context* ctx = mtmd_init_from_file(argv[1], nullptr, params);
  if (!ctx) return fail("mtmd_init_from_file failed");

  mtmd_bitmap* bitmap = mtmd_bitmap_init(width, height, rgb.data());
  mtmd_input_part part = {nullptr, bitmap};
  const mtmd_input_part* parts[] = {&part};
  mtmd_input_chunks* chunks = mtmd_input_chunks_init();
  if (mtmd_tokenize_from_parts(ctx, chunks, parts, 1, false) != 0) return fail("mtmd_tokenize_from_parts failed");
  const mtmd_input_chunk* media = nullptr;
  for (size_t i = 0; i < mtmd_input_chunks_size(chunks); ++i) {
    const mtmd_input_chunk* c = mtmd_input_chunks_get(chunks, i);
    if (mtmd_input_chunk_get_type(c) != MTMD_INPUT_CHUNK_TYPE_TEXT) media = c;
  }
  if (!media) return fail("no media chunk");
  const size_t tokens = mtmd_input_chunk_get_n_tokens(media);

  std::vector<double> seconds;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (mtmd_encode_chunk(ctx, media) != 0) return fail("mtmd_encode_chunk failed");
    const auto t1 = std::chrono::steady_clock::now();
    if (r > 0) seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  FILE* out = std::fopen(argv[8], "wb");
  if (!out) return fail("cannot write OUT_F32");
  std::fwrite(mtmd_get_output_embd(ctx), sizeof(float), tokens * (size_t)n_embd, out);
  std::fclose(out);
  std::printf("{\"tokens\": %zu, \"seconds\": [", tokens);
  for (size_t i = 0; i < seconds.size(); ++i) std::printf("%s%.6f", i ? ", " : "", seconds[i]);
  std::printf("]}\n");

  mtmd_input_chunks_free(chunks);
  mtmd_bitmap_free(bitmap);
  mtmd_free(ctx);
  return 0;
}
'''
OUTTYPES = ("f16", "bf16", "q8_0", "f32")  # convert_hf_to_gguf.py --outtype values for an mmproj GGUF


def write_checkpoint(tower: torch.nn.Module, projector: torch.nn.Module, path: Path, *, timm_name: str, tile: int,
                     norm_mean, norm_std) -> Path:
    """`tower` (a RadioEncoder of the timm ViT `timm_name`'s widths; llama.cpp's converter takes only ViT-H's,
    `vit_huge_patch16_224`) and `projector` (a VisionProjector) saved as a Nano V2 VL checkpoint
    directory by `vl.checkpoint.nano_vl.save_pretrained` (the hub's tensor names and config.json), with a random
    one-layer LLM of the projector's output width, and a preprocessor_config.json carrying the normalisation (the
    converter's source for it)."""
    mlp1 = projector.mlp1
    llm_dim, hidden = mlp1[3].weight.shape[0], mlp1[1].weight.shape[0]
    lm = LMConfig(vocab_size=256, hidden_size=llm_dim, pattern="-", intermediate_size=64)
    cfg = VLConfig(lm=lm, vision=VisionConfig(model=timm_name, num_prefix_tokens=tower.num_prefix_tokens),
                   force_image_size=tile, projector_hidden_size=hidden, vit_hidden_size=tower.embed_dim,
                   norm_mean=tuple(norm_mean), norm_std=tuple(norm_std))
    with torch.device("meta"):
        model = NemotronVL(cfg)
    model.vision, model.projector = tower, projector
    model.language_model.to_empty(device="cpu")
    with torch.no_grad():
        randomize_(model.language_model, 0)
    model.language_model.to(tower.patch_generator.embedder.weight.dtype)
    save_pretrained(model, path)
    (Path(path) / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": list(norm_mean), "image_std": list(norm_std), "image_size": tile}, indent=1))
    return Path(path)


class Mtmd:
    """A llama.cpp tree with libmtmd built (`cmake --build build --target mtmd`): its converter, its headers and the
    shared libraries the timing program links against."""

    def __init__(self, root, python: str | None = None):
        root = Path(root).expanduser().resolve()
        libdir = next((d for d in (root / "build" / "bin", root / "build" / "lib", root / "bin", root / "lib")
                       if (d / "libmtmd.so").is_file()), None)
        problems = []
        if libdir is None:
            problems.append(f"no libmtmd.so in {root}/build/bin, build/lib, bin or lib (build the mtmd target)")
        if not (root / "convert_hf_to_gguf.py").is_file():
            problems.append(f"no convert_hf_to_gguf.py in {root}")
        if not (root / "tools" / "mtmd" / "mtmd.h").is_file():
            problems.append(f"no tools/mtmd/mtmd.h in {root}")
        if problems:
            raise FileNotFoundError("; ".join(problems) + " (expected a llama.cpp source tree built with cmake)")
        self.root, self.libdir, self.python = root, libdir, python or sys.executable

    def build_tool(self, work: Path) -> Path:
        """`TOOL_SOURCE` written into `work` and compiled against this tree's libmtmd -> the program."""
        out = Path(work) / "mtmd_encode"
        source = Path(work) / "mtmd_encode.cpp"
        source.write_text(TOOL_SOURCE)
        includes = [self.root / "tools" / "mtmd", self.root / "include", self.root / "ggml" / "include"]
        cmd = [os.environ.get("CXX", "g++"), "-O2", "-std=c++17", str(source), "-o", str(out),
               *(f"-I{d}" for d in includes), f"-L{self.libdir}", "-lmtmd", f"-Wl,-rpath,{self.libdir}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"building mtmd_encode failed (exit {r.returncode}): {r.stderr.strip()[-800:]}")
        return out

    def convert(self, hf_dir: Path, outtype: str, dst: Path) -> Path:
        """`convert_hf_to_gguf.py hf_dir --mmproj --outtype TYPE`: the mmproj GGUF (tower + projector)."""
        if outtype not in OUTTYPES:
            raise ValueError(f"mmproj GGUF type {outtype!r}: expected one of {', '.join(OUTTYPES)}")
        r = subprocess.run([self.python, str(self.root / "convert_hf_to_gguf.py"), str(hf_dir), "--mmproj",
                            "--outtype", outtype, "--outfile", str(dst)], capture_output=True, text=True,
                           timeout=1800, env=dict(os.environ, PYTHONPATH=str(self.root / "gguf-py")))
        if r.returncode != 0 or not Path(dst).is_file():
            raise RuntimeError(f"convert_hf_to_gguf.py --mmproj --outtype {outtype} failed (exit {r.returncode}): "
                               f"{(r.stderr or r.stdout).strip()[-800:]}")
        return Path(dst)

    def encode(self, tool: Path, gguf: Path, rgb: np.ndarray, *, threads: int, repeats: int, width: int,
               work: Path) -> tuple[list[float], np.ndarray]:
        """One process: load `gguf`, encode the (H, W, 3) uint8 image once untimed and `repeats` times timed ->
        (seconds per timed call, the last call's embeddings as a (tokens, width) float32 array)."""
        work = Path(work)
        image, out = work / "image.rgb", work / "embeddings.f32"
        rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
        image.write_bytes(rgb.tobytes())
        h, w = rgb.shape[:2]
        r = subprocess.run([str(tool), str(gguf), str(image), str(w), str(h), str(threads), str(repeats), str(width),
                            str(out)], capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            raise RuntimeError(f"mtmd_encode {Path(gguf).name} failed (exit {r.returncode}): {r.stderr.strip()[-800:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        emb = np.fromfile(out, dtype=np.float32).reshape(res["tokens"], width)
        return res["seconds"], emb
