// Times llama.cpp's multimodal encoder (libmtmd) on one image and writes what it produced, for `vl bench
// --vision-tower --llama-cpp DIR` (vl/bench/llama_cpp_mtmd.py builds this file against DIR's libraries).
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
