"""The reliability matrix's rows (docs/reliability_policy.md section 6): for each, the fault, the pass criterion and
the tests that reproduce the fault and check the criterion ("path::function", every parametrization, or
"path::function[param]"). scripts/reliability_table.py runs them and writes docs/reliability.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    id: str
    fault: str
    criterion: str
    tests: tuple[str, ...]  # "path::function" (every parametrization) or "path::function[param]"
    note: str = ""


T_IMG, T_VID, T_PDF, T_SBX = ("tests/processing/test_images.py", "tests/processing/test_video.py",
                              "tests/processing/test_documents.py", "tests/processing/test_sandbox.py")
T_VRF, T_PRF = "tests/processing/test_video_real_files.py", "tests/processing/test_documents_real_files.py"
REAL = "found by running real-file corpora (image suites, a video-decoder suite, a malformed-PDF suite)"
T_LM, T_VLM, T_QL = ("tests/checkpoint/test_lm_loading.py", "tests/modeling/test_vlm.py",
                     "tests/quant/test_checkpoint_loading.py")
T_NH, T_ENG = "tests/modeling/test_nemotron_h.py", "tests/runtime/test_engine.py"
T_UIA, T_UIC, T_UIL, T_UIP = ("tests/ui/test_ui_app.py", "tests/ui/test_ui_cli.py", "tests/ui/test_ui_load.py",
                              "tests/ui/test_ui_pieces.py")
T_HF, T_RUN, T_E2E = "tests/hf/test_hf_pipeline.py", "tests/eval/test_runner.py", "tests/eval/test_runner_e2e.py"
T_CLI, T_SPS, T_SFL, T_SMP, T_SED = ("tests/test_vl_chat_cli.py", "tests/server/test_server_prompt_size.py",
                                    "tests/server/test_server_fields.py", "tests/server/test_media_policy.py",
                                    "tests/server/test_server_edge.py")
T_RPR, T_RFT = "tests/server/test_remote_protocol.py", "tests/eval/test_remote_faults.py"
T_AUD, T_OMNI, T_SAUD = ("tests/processing/test_audio.py", "tests/runtime/test_omni_engine.py",
                         "tests/server/test_server_audio.py")
SEAMS = "found by real clients (openai SDKs, llama.cpp, curl, raw sockets) and public media corpora"
R = "tests/reliability/"
R_SRV, R_INP, R_ISO, R_CK, R_NUM = (R + "test_serving_rows.py", R + "test_serving_inprocess.py",
                                    R + "test_isolation_leaks.py", R + "test_checkpoint_rows.py",
                                    R + "test_numerics_vl.py")


def _t(path: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{path}::{n}" for n in names)


ROWS = [
    # --- 6.1 images ---------------------------------------------------------------------------------------
    Row("I1", "PNG with IHDR 40000x40000 (tiny file)", "clear 'image too large' before decode; RSS flat",
        _t(T_IMG, "test_i1_header_bomb_refused_before_decode_rss_flat", "test_bomb_warning_threshold_is_folded_into_our_cap")),
    Row("I2", "just below / above the pixel cap", "below accepted, above rejected (exact boundary)",
        _t(T_IMG, "test_i2_exact_pixel_boundary")),
    Row("I3", "100000x0 and 0x0 dimensions", "clear error; no exception leaks",
        _t(T_IMG, "test_i3_zero_dimensions", "test_i3_zero_sized_pil_input")),
    Row("I4", "JPEG/PNG truncated at 50 %, last byte removed, bad CRC", "clear error (strict); never a half-grey image",
        _t(T_IMG, "test_i4_truncated", "test_i4_bad_png_crc", "test_i4_strict_mode_cannot_be_bypassed")),
    Row("I5", "empty, random bytes, text, EPS/PDF/MP4/PSD named .png", "'unsupported format'; EPS never reaches "
        "Ghostscript (a TIFF named .png is read as the TIFF it is: row I15)",
        _t(T_IMG, "test_i5_unsupported_formats_by_magic_bytes", "test_i5_allowlisted_formats_decode")),
    Row("I6", "EXIF orientation 0, 9, rational (-1,0), doubled Exif header", "accepted un-rotated, warning logged",
        _t(T_IMG, "test_i6_invalid_orientation_kept_unrotated_with_warning", "test_i6_duplicated_exif_header_accepted"),
        "Pillow 12.3 reads through a doubled Exif header, so its valid orientation is applied (accepted, no error)"),
    Row("I7", "valid orientation 6 / 8", "W/H swapped; golden corner pixel",
        _t(T_IMG, "test_i7_orientation_6_and_8_swap_and_move_the_corner", "test_orientation_size_used_for_tiling")),
    Row("I8", "RGBA, LA, P+transparency, CMYK, I;16, 1-bit, 16-bit PNG", "RGB of expected size; golden pixels",
        _t(T_IMG, "test_i8_modes_to_rgb_golden_pixels", "test_i8_cmyk_cyan")),
    Row("I9", "5,000-frame GIF/WebP; MPO with a huge 2nd frame", "frame 0 only (seeks counted); no seek to frame 2",
        _t(T_IMG, "test_i9_many_frame_animation_reads_frame_0_only", "test_i9_mpo_huge_second_frame_never_sought")),
    Row("I10", "limit+1 images (or documents, videos) in one request", "'at most N' error; nothing decoded",
        _t(T_IMG, "test_i10_too_many_images_refused_before_decode")
        + _t(R_ISO, "test_i10_one_item_over_a_cap_is_refused_before_anything_is_decoded")
        + _t(T_UIA, "test_too_many_images_and_missing_question"),
        "fixed here: two PDFs were both rendered before the document cap refused them"),
    Row("I11", "body over max_file_size; multipart with a huge filename", "413 before the handler runs",
        _t(T_IMG, "test_i11_byte_cap_before_pillow") + _t(T_UIC, "test_upload_over_the_cap_is_refused")
        + _t(R_SRV, "test_s9_oversize_upload_is_413_and_nothing_is_written")),
    Row("I12", "fuzz: mutated PNG/JPEG/GIF/WebP bytes (~2,000 cases)", "only typed errors escape; no worker death",
        _t(T_IMG, "test_i12_fuzz_only_typed_errors_escape", "test_i12_fuzz_cases_do_not_kill_the_isolated_worker")
        + _t(R + "test_image_fuzz.py", "test_i12_2000_mutated_images_only_typed_errors_escape",
             "test_i12_fuzz_reached_the_decoders")),
    Row("I13", "PNG tRNS colour key in RGB, grey (1/4/8/16-bit) and 16-bit RGB images", "composited over white like alpha",
        _t(T_IMG, "test_8_colour_key_composited_over_white", "test_8_colour_key_at_the_file_bit_depth"), REAL),
    # --- 6.2 video ---------------------------------------------------------------------------------------
    Row("V1", "zero-length file; 100 random bytes as .mp4", "clear error at open", _t(T_VID, "test_v1_empty_and_random_bytes")),
    Row("V2", "MP4 cut mid-file (moov missing / mdat truncated)", "clear error or flagged partial decode; never a hang",
        _t(T_VID, "test_v2_moov_missing", "test_v2_v3_mdat_truncated_partial_decode_indices_in_range",
           "test_v2_v3_decord_on_truncated_file_fails_cleanly", "test_v8_timeout_then_next_request_ok")),
    Row("V3", "header frame count >> frames present", "sampled indices in range; no 'no more frames' 500",
        _t(T_VID, "test_v2_v3_mdat_truncated_partial_decode_indices_in_range", "test_v2_v3_decord_on_truncated_file_fails_cleanly")),
    Row("V4", "8192x8192 frames", "rejected by the per-frame pixel cap before decoding",
        _t(T_VID, "test_v4_frame_pixel_cap_before_decoding", "test_v4_exact_boundary")),
    Row("V5", "hours-long, low-bitrate video", "rejected by duration / frame-walk cap; RSS flat",
        _t(T_VID, "test_v5_duration_cap", "test_v5_frame_walk_cap_when_the_header_has_no_count")),
    Row("V6", "audio-only MP4; 0 fps / VFR metadata", "'no video stream' / measured fps; valid sample",
        _t(T_VID, "test_v6_audio_only", "test_v6_variable_frame_rate", "test_v6_missing_fps_is_measured")),
    Row("V7", "200 sequential opens in one worker", "fd count and RSS return to baseline",
        _t(T_VID, "test_v7_repeated_opens_leak_nothing", "test_v7_isolated_calls_leave_no_temp_files")
        + _t(T_SBX, "test_v7_200_sequential_calls_no_fd_leak", "test_crash_cycles_do_not_leak_fds")
        + _t(R_ISO, "test_many_isolated_requests_leak_no_fds_temp_files_workers_or_memory")),
    Row("V8", "decoder worker SIGKILLed mid-decode", "clear 'decoder crashed'; next request OK; worker respawned",
        _t(T_VID, "test_v8_worker_killed_mid_decode_then_next_request_ok")
        + _t(T_SBX, "test_v8_worker_killed_mid_decode", "test_crash_becomes_typed_error_and_worker_respawns")),
    Row("V9", "several video streams (the best one not first; a small first and a large second; audio first)",
        "probe, caps and decode on the one best stream; frames by content, times = container pts",
        _t(T_VRF, "test_1_multistream_probe_cap_and_decode_use_the_best_stream",
           "test_1_frame_size_cap_applies_to_the_decoded_stream", "test_1_a_huge_second_stream_is_never_decoded",
           "test_2_audio_stream_first"), REAL),
    Row("V10", "MPEG-PS/TS (decord returns wrong frames; seeks land wrong), MKV, WebM, AVI, MOV, Ogg, FLV, HEVC, "
        "B-frames, late start", "every backend, dense and sparse sampling: frames by content, times = container pts",
        _t(T_VRF, "test_2_frames_by_content_and_times_by_container_pts", "test_2_sparse_sampling_across_long_gaps",
           "test_2_nonzero_start_time", "test_9_sniffing_ignores_the_file_name"), REAL),
    Row("V11", "first keyframe flagged discard (MP4 edit list)", "only displayed frames counted and timed; not partial",
        _t(T_VRF, "test_3_discarded_packets_are_not_frames"), REAL),
    Row("V12", "display matrix: rotations and flips", "applied whatever the backend; golden tile",
        _t(T_VRF, "test_4_rotation_applied_whatever_the_backend"), REAL),
    Row("V13", "prompt timestamps at 60 fps; VFR", "presentation time of the frame shown (default)",
        _t(T_VRF, "test_5_default_timestamps_are_the_presentation_times") + _t(T_VID, "test_v6_variable_frame_rate"),
        REAL),
    Row("V14", "image files, still-image codecs, HLS playlist / concat list naming a file outside the root, as video",
        "'unsupported format' before any decoder; no nested open", _t(T_VRF,
        "test_9_image_files_are_refused_on_the_video_path", "test_9_still_image_codecs_in_a_video_container_are_refused",
        "test_9_playlists_and_lists_are_never_followed", "test_9_every_nested_open_goes_through_the_guard"), REAL),
    # --- 6.3 PDF -----------------------------------------------------------------------------------------
    Row("P1", "encrypted PDF, no / wrong password", "clear 'encrypted PDF' error", _t(T_PDF, "test_p1_encrypted_pdf")),
    Row("P2", "10,000-page PDF", "page cap before anything is rendered", _t(T_PDF, "test_p2_page_cap_before_rendering")
        + _t(T_UIA, "test_page_cap_is_a_clear_message_and_a_range_gets_past_it")),
    Row("P3", "14400x14400 pt mediabox", "pixel cap from page size; rejected before render",
        _t(T_PDF, "test_p3_pixel_cap_from_page_size_before_rendering")),
    Row("P4", "truncated / garbage PDF", "clear error; worker alive", _t(T_PDF, "test_p4_truncated_and_garbage")),
    Row("P5", "2 threads render different PDFs, 50 iterations", "no crash (one global lock); expected hashes",
        _t(T_PDF, "test_p5_two_threads_one_lock")),
    Row("P6", "PDF sent to the image path", "rejected by sniffing; Pillow's PDF parser never invoked",
        _t(T_PDF, "test_p6_pdf_to_image_endpoint_and_image_to_pdf_endpoint")),
    Row("P7", "failing PDFs (encrypted, no pages, garbage, truncated) in many orders and fresh processes",
        "same code and message every time; never 'PDFium: Success'",
        _t(T_PRF, "test_6_pdf_error_codes_depend_on_the_file_alone"), REAL),
    Row("P8", "page bomb: 200 blank 2048-pt pages in a 38 KB file", "'too large' before rendering; peak RSS flat; "
        "pages rendered and tiled one at a time", _t(T_PRF, "test_7_page_bomb_refused_before_rendering",
        "test_7_page_bomb_peak_memory", "test_7_pages_are_rendered_and_tiled_one_at_a_time",
        "test_7_processor_page_tiles_equal_tiling_the_rendered_page"), REAL),
    # --- 6.4 checkpoints ---------------------------------------------------------------------------------
    Row("C1", ".bin pickle whose __reduce__ writes a marker", "refused; marker never created",
        _t(T_LM, "test_pickle_only_checkpoint_is_refused_never_unpickled", "test_pickle_beside_safetensors_is_never_opened")),
    Row("C2", "torch.load with a disallowed global", "UnpicklingError; static scan: no unsafe load, no fallback",
        _t(R_CK, "test_c2_every_torch_load_is_weights_only_and_pickle_is_confined",
           "test_c2_weights_only_load_refuses_a_disallowed_global"),
        "no torch.load exists in the product; pickle is read only from our own child processes (SECURITY.md)"),
    Row("C3", "header > file; 150 MB header; overlap; gap; shape x dtype != span", "clean error per case; no OOM; "
        "< 20 MB allocated",
        _t(T_LM, "test_malformed_headers_fail_fast", "test_truncated_safetensors")
        + _t(R_CK, "test_c3_malformed_header_fails_without_allocating")),
    Row("C3b", "duplicate tensor name in a header", "rejected by our pre-check",
        (f"{T_LM}::test_malformed_headers_fail_fast[duplicate]",
         f"{R_CK}::test_c3_malformed_header_fails_without_allocating[duplicate]")),
    Row("C4", "one projector tensor missing", "load fails naming the key",
        _t(T_LM, "test_missing_tensor_is_named", "test_missing_expert_is_refused")
        + _t(T_VLM, "test_missing_projector_tensor_is_refused")),
    Row("C5", "extra unexpected tensor", "fails unless allowlisted",
        _t(T_LM, "test_unexpected_tensor_is_refused") + _t(R_CK, "test_c5_allowlisted_extras_load_and_others_are_refused")),
    Row("C6", "shape mismatch in one layer", "fails; ignore_mismatched_sizes never used",
        _t(T_LM, "test_wrong_shape_is_named") + _t(T_VLM, "test_wrong_vision_shape_is_refused")
        + _t(R_CK, "test_c2_every_torch_load_is_weights_only_and_pickle_is_confined")),
    Row("C7", "F16 for BF16; FP8 without scale; NVFP4 without weight_scale_2", "fails naming tensor, expected/actual",
        _t(T_LM, "test_wrong_dtype_is_refused")
        + _t(T_QL, "test_packed_weight_without_its_scale_is_refused_naming_it",
             "test_inconsistent_fp8_tensors_are_refused_naming_them", "test_nan_block_scale_is_refused")),
    Row("C8", "NaN / Inf in one weight", "flagged by the (opt-in) post-load scan",
        _t(T_LM, "test_nan_scan_is_opt_in") + _t(R_CK, "test_c8_non_finite_weight_is_flagged_by_the_scan"),
        "vl.load_pretrained(scan_nan=True); off by default so loading stays one pass"),
    Row("C9", "auto_map + malicious modeling file", "no code executed; load refused when code would be needed",
        _t(T_LM, "test_unknown_architecture_with_auto_map_is_refused_without_running_code")
        + _t(T_VLM, "test_auto_map_with_malicious_code_never_runs") + _t(T_HF, "test_auto_map_remote_code_never_runs"),
        "a known architecture with auto_map loads natively and ignores the remote code"),
    Row("C10", "shard index -> missing shard; truncated shard", "clear error naming the shard",
        _t(T_LM, "test_sharded_index_errors_name_the_shard")
        + _t(R_CK, "test_c10_sharded_vl_missing_or_truncated_shard_is_named")),
    # --- 6.5 numerics -----------------------------------------------------------------------------------
    Row("N1", "FP8 E4M3/E5M2 quant->dequant vs reference, sizes 1..8193, strided",
        "bit-identical; strided == contiguous; saturation at 448; NaN documented",
        _t("tests/quant/test_fp8.py", "test_reference_encoder_agrees_with_hand_golden_values", "test_e4m3_golden_values",
           "test_nan_stays_nan_and_dequantizes_to_nan", "test_per_tensor_bit_identical_to_reference",
           "test_per_channel_bit_identical_to_reference", "test_blockwise_bit_identical_to_reference_and_layout",
           "test_strided_equals_contiguous", "test_static_activation_quantization_saturates_at_448")),
    Row("N2", "NVFP4 pack/unpack golden vectors", "E2M1 LUT x sign; low nibble = even column",
        _t("tests/quant/test_nvfp4.py", "test_every_code_in_the_low_nibble_is_the_even_element",
           "test_every_code_in_the_high_nibble_is_the_odd_element", "test_pack_golden_bytes", "test_dequantize_golden")),
    Row("N3", "NVFP4 block scales: tiny, zero, > 448, global-scale convention", "no zero/NaN scales; golden dequant",
        _t("tests/quant/test_nvfp4.py", "test_zero_block_gets_unit_scale_and_no_nan", "test_all_zero_tensor",
           "test_tiny_block_clamps_to_smallest_subnormal_not_zero", "test_block_scale_above_448_saturates_and_values_clip",
           "test_global_scale_convention_is_multiplicative", "test_quantize_golden_two_blocks")),
    Row("N4", "tiny model, BF16 vs FP32 reference forward", "bf16 tolerance; top-1 agreement",
        _t(R_NUM, "test_n4_bf16_vl_forward_close_to_fp32", "test_n4_literal_elementwise_bf16_tolerance")
        + _t(T_NH, "test_bf16_logits_within_bf16_tolerance"),
        "asserted: per-position relative L2 <= 5 %, top-1 equal where the fp32 margin exceeds 2x the error; the "
        "literal elementwise rtol 1.6e-2 / 99 % top-1 is a strict xfail with the measured figures"),
    Row("N5", "same input twice, same process", "bitwise identical",
        _t(R_NUM, "test_n5_same_input_twice_is_bitwise_identical") + _t(T_NH, "test_logits_to_keep_and_determinism")),
    Row("N6", "batch of 4 (padded) vs 4 singles", "atol = rtol = 1e-5 (fp32)",
        _t(R_NUM, "test_n6_padded_batch_of_4_equals_singles", "test_n6_literal_atol_rtol_1e5")
        + _t(T_NH, "test_left_padded_batch_equals_singles") + _t(T_ENG, "test_chat_batch_equals_singles"),
        "asserted at atol 5e-5 / rtol 1e-5; the literal 1e-5 is a strict xfail (max 1.4e-5 on a near-zero logit)"),
    Row("N7", "greedy twice; sampling with a fixed seed", "identical token ids",
        _t(R_NUM, "test_n7_greedy_and_seeded_sampling_repeat_exactly") + _t(T_ENG, "test_seeded_sampling_is_reproducible")),
    Row("N8", "KV-cache incremental decode vs full recompute", "within 1e-3",
        _t(R_NUM, "test_n8_cached_incremental_decode_equals_full_recompute")
        + _t(T_NH, "test_cached_decode_equals_full_forward")),
    Row("N9", "pixel shuffle v2 on an arange tensor", "token (i,j) = concat of the 2x2 block, exactly",
        _t("tests/modeling/test_projector.py", "test_pixel_shuffle_v2_on_arange", "test_token_order_through_projector_function_is_row_major")),
    Row("N10", "CPE resize 128x128 -> 32x32", "bilinear, align_corners=False (differs from True)",
        _t("tests/modeling/test_radio.py", "test_cpe_128_to_32_uses_align_corners_false")),
    Row("N11", "tiling: aspect ratios, ties, tiny and extreme images", "grid, tile count, thumbnail-last match reference",
        _t("tests/processing/test_tiling.py", "test_grid_table", "test_grid_equals_reference_and_transformers_on_a_sweep",
           "test_tile_count_and_thumbnail_rule", "test_tiles_row_major_and_thumbnail_last")),
    Row("N12", "Mamba-2 chunked SSD vs step recurrence, lengths 1/127/128/129", "within 1e-5 (fp32)",
        _t(R_NUM, "test_n12_chunked_ssd_equals_recurrence", "test_n12_state_carried_across_calls_equals_one_scan")),
    Row("N13", "hybrid: cached decode vs full forward (teacher-forced)", "logits within 1e-3",
        _t(T_NH, "test_cached_decode_equals_full_forward", "test_chunked_prefill_equals_one_shot",
           "test_greedy_continuation_equals_transformers_generate")),
    Row("N14", "EVS mask: static frames, one moving patch, q in {0, .5, .75, .99}", "frame 0 kept; K formula; stable ties",
        _t("tests/token_reduction/test_evs.py", "test_reliability_n14_static_frames_one_moving_patch",
           "test_retained_count_formula", "test_mask_equals_transformers_reference")),
    Row("N15", "think splitter: pre-opened, close only, none, unclosed, split tags", "streaming == non-streaming",
        _t("tests/processing/test_chat.py", "test_split_reasoning_golden", "test_stream_cut_at_every_position_equals_non_streaming",
           "test_stream_equals_non_streaming_on_random_texts", "test_splitter_finish_is_final")),
    # --- 6.6 serving -------------------------------------------------------------------------------------
    Row("S1", "prompt over context; max_new_tokens <= 0 or huge", "clear 4xx quoting the limit and the request",
        _t(R_SRV, "test_s1_max_new_tokens_out_of_range_quotes_the_limit", "test_s1_prompt_over_the_context_quotes_both_numbers")
        + _t(T_ENG, "test_errors_come_before_any_work") + _t(T_UIA, "test_bad_options_are_clear_messages")),
    Row("S2", "queue(max_size=4), concurrency 1, burst of 50", "1 running + <= 4 waiting; rest 503 at once; in order",
        _t(R_SRV, "test_s2_burst_of_50_sheds_at_once_and_the_queued_ones_finish_in_order")
        + _t(T_UIL, "test_eight_concurrent_clients_complete_or_are_refused")),
    Row("S3", "client disconnects mid-generation", "work aborted before the answer's end; slot freed",
        _t(R_INP, "test_s3_client_disconnect_aborts_generation_and_frees_the_slot")
        + _t(T_UIA, "test_stop_really_stops_generation")),
    Row("S4", "handler made slow", "our time limit fires -> clear message; worker recycled",
        _t(R_INP, "test_s4_slow_generation_is_cut_at_the_request_time_limit",
           "test_s4_slow_decode_is_killed_at_the_worker_time_limit_and_the_worker_replaced")
        + _t(T_UIC, "test_time_limit_cuts_the_answer"),
        "generation stops between tokens; one forward pass (prefill) is not interruptible"),
    Row("S5", "decode worker SIGKILL", "clear 5xx for that request only; next request OK",
        _t(R_SRV, "test_s5_killed_decode_worker_fails_that_request_only_and_the_next_is_ok")),
    Row("S6", "worker over its memory rlimit (a bomb without our cap)", "contained to the worker; clear error; up",
        _t(R_INP, "test_s6_worker_over_its_memory_cap_is_a_clear_error_and_the_service_stays_up")
        + _t(T_SBX, "test_memory_cap"),
        "81 MP decodes within 1 GiB here, so the test caps the worker at 640 MB (and first serves a normal page under that cap)"),
    Row("S7", "path traversal on file= routes (../, abs, encoded, //, case, dotfiles, model dir, symlink)",
        "403/404; content never returned",
        _t(R_SRV, "test_s7_traversal_variants_never_return_content")
        + _t(T_UIA, "test_only_uploads_and_examples_are_served") + _t(T_UIP, "test_served_paths_block_everything_but_the_examples")),
    Row("S8", "URLs to 127.0.0.1, ::1, localhost, 169.254.169.254, 10.x, 192.168.x", "rejected; loopback hit count 0",
        _t(R_SRV, "test_s8_private_and_loopback_urls_are_refused_without_a_request")
        + _t(T_HF, "test_urls_are_refused_and_never_fetched") + _t(T_IMG, "test_urls_are_refused"),
        "redirects from a public host cannot be tested offline: Gradio's safehttpx validates every resolved address"),
    Row("S9", "upload > max_file_size; multipart with a 2 MB / 50 MB filename", "413; disk usage unchanged",
        _t(R_SRV, "test_s9_oversize_upload_is_413_and_nothing_is_written") + _t(T_UIC, "test_upload_over_the_cap_is_refused")),
    Row("S10", ".png holding PDF/EPS/HTML/SVG", "rejected by sniffing; nothing served back as HTML",
        _t(R_SRV, "test_s10_png_with_other_content_is_refused_by_sniffing_and_never_served_as_html")
        + _t(T_UIA, "test_corrupt_upload_is_a_message_and_the_next_request_works")),
    Row("S11", "mixed valid/invalid soak", "errors only on the bad 20 %; RSS < +10 %; fds/processes flat",
        _t(R + "test_soak_short.py", "test_s11_short_soak_errors_only_for_bad_inputs_and_resources_flat")
        + _t("tests/ui/test_ui_heap.py", "test_trim_heap_gives_freed_pages_back_to_the_os",
             "test_stream_chat_trims_the_heap_when_every_request_ends")
        + _t(T_UIA, "test_document_requests_leave_no_stray_files_in_the_upload_folder")),
    Row("S12", "pipeline API given a URL or path string", "rejected at our boundary; transformers never sees it",
        _t(T_HF, "test_urls_are_refused_and_never_fetched", "test_local_paths_only_under_allowed_roots",
           "test_data_uri_is_decoded_here")),
    Row("S13", "model load failure at startup (missing shard)", "exits non-zero with a clear message",
        _t(T_UIC, "test_startup_fails_cleanly_without_a_model", "test_startup_fails_cleanly_with_a_missing_shard")),
    # --- 6.7 eval ---------------------------------------------------------------------------------------
    Row("E1", "kill -9 the runner at random items (5x), resume", "no duplicate/missing records; identical metrics",
        _t(T_RUN, "test_sigkill_at_random_items_then_resume_matches_an_uninterrupted_run", "test_a_sigkilled_runner_leaves_no_worker_process_behind")
        + _t(T_E2E, "test_cli_sigkill_mid_run_then_resume_equals_uninterrupted")),
    Row("E2", "last JSONL line half-written", "repaired; that item redone",
        _t(T_RUN, "test_torn_last_line_is_cut_and_that_item_redone", "test_repair_tail_cases")),
    Row("E3", "poison items (bomb, corrupt video, encrypted PDF)", "recorded as error with a class; run continues",
        _t(T_E2E, "test_poison_media_are_typed_errors_and_the_run_goes_on")
        + _t(T_RUN, "test_url_and_escaping_media_are_recorded_as_errors_without_a_model_call")),
    Row("E4", "transient errors in 30 % of calls", "retried with backoff; all end ok; retries counted",
        _t(T_RUN, "test_transient_failures_are_retried_with_backoff_and_all_items_end_ok",
           "test_retriable_failures_stop_after_max_attempts")),
    Row("E5", "changed template / fingerprint / decoding config, resume", "cache misses; nothing stale reused",
        _t(T_RUN, "test_a_changed_fingerprint_or_item_never_reuses_records")),
    Row("E6", "two runs with the same seeds", "byte-identical outputs minus timestamps",
        _t(T_RUN, "test_two_runs_give_identical_predictions_minus_timestamps")),
    Row("E7", "disk full (ENOSPC from the writer)", "clear stop; records intact and resumable",
        _t(T_RUN, "test_disk_full_stops_cleanly_keeps_records_and_resumes", "test_a_failed_write_leaves_no_partial_record")),
    Row("E8", "per-item timeout (item hangs)", "recorded as timeout; worker replaced; run goes on",
        _t(T_RUN, "test_per_item_timeout_kills_the_worker_and_the_run_goes_on", "test_a_crashing_worker_is_replaced_and_the_crash_recorded")),
    Row("E9", "scorer port vs harness golden values (docs/eval_scoring.md §9)", "every value identical",
        _t("tests/eval/test_eval_metrics.py", "test_anls_golden", "test_relaxed_golden", "test_evalai_le_golden",
           "test_evalai_vk_golden_differs_on_trailing_period", "test_vqa_accuracy_golden", "test_mcq_le_golden",
           "test_mcq_old_golden", "test_ocrbench_golden", "test_strip_reasoning_golden",
           "test_mlvu_macro_divides_by_all_types_even_if_empty")),
    # --- 6.8 real clients and real files: images and PDFs -----------------------------------------------
    Row("I14", "BMP with 4-bit / 8-bit RLE (odd literal runs, early end of bitmap)", "golden pixels; truncated or "
        "garbage runs give typed errors", _t(T_IMG, "test_bmp_rle_golden_pixels", "test_bmp_rle_truncated_and_garbage_are_typed"),
        SEAMS),
    Row("I15", "TIFF scans (7 codecs, multi-page), HEIC and AVIF photos, any file name", "decoded by content with "
        "the same caps before decode and rotation once; rare TIFF codecs refused by name; fuzzed copies only typed",
        _t(T_IMG, "test_i5_allowlisted_formats_decode", "test_tiff_compressions_scanners_write_decode",
           "test_tiff_rare_compressions_refused_by_name", "test_tiff_modes_orientation_and_pages",
           "test_tiff_header_bomb_refused_before_decode", "test_heic_avif_decode_with_orientation_and_size_cap",
           "test_iso_media_brands", "test_phone_and_scanner_files_through_the_processor_next_to_png")
        + _t(R + "test_image_fuzz.py", "test_i12_later_formats_mutated_only_typed_errors_escape",
             "test_i12_later_formats_fuzz_reached_every_decoder"), SEAMS),
    Row("I16", "an unreadable file given to `vl chat` (text named .png, truncated JPEG, bad CRC, EPS)",
        "refused by the header checks before the model loads; the next good file works",
        _t(T_IMG, "test_sniff_image_refuses_what_decoding_refuses_without_decoding")
        + _t(T_CLI, "test_an_unreadable_file_is_refused_before_the_model_loads",
             "test_a_refused_file_then_a_good_one_in_one_process", "test_files_the_model_reads_pass_the_check"), SEAMS),
    Row("P9", "filled PDF form fields (appearance streams, NeedAppearances)", "drawn as viewers draw them; blank "
        "fields stay blank", _t(T_PDF, "test_filled_form_fields_are_drawn"), SEAMS),
    Row("P10", "a page whose font is not embedded, rendered after other PDFs", "identical pixels whatever was "
        "rendered before, in-process and in one worker", _t(T_PDF,
        "test_pages_with_missing_fonts_render_independently_of_history"), SEAMS),
    # --- 6.8 video -----------------------------------------------------------------------------------------
    Row("V15", "a 2-video + 2-audio clip at 8 fps, other videos, the clip again, through one sandbox worker",
        "every frame, identical both times; a resource failure is never corrupt_media; a worker is replaced after "
        "any failure that is not the file's", _t(T_VID, "test_several_videos_in_a_row_through_one_sandbox_worker",
        "test_an_allocation_failure_is_never_corrupt_media", "test_a_decord_that_does_not_load_is_ours_not_the_files")
        + _t(R_ISO, "test_the_apps_processor_decodes_videos_in_a_row_in_one_worker")
        + _t(T_SBX, "test_a_library_maps_under_the_memory_cap", "test_a_failure_that_is_not_the_files_replaces_the_worker",
             "test_resident_memory_over_the_cap_kills_the_worker"), SEAMS),
    Row("V16", "repeated decodes with the garbage collector off", "decoder thread count back to its start; a worker "
        "that keeps threads or memory is replaced", _t(T_VID, "test_decoding_leaves_no_decoder_threads_behind")
        + _t(T_SBX, "test_a_worker_that_keeps_threads_or_memory_is_replaced"), SEAMS),
    Row("V17", "CENC-encrypted MP4 (box scan or packet side data); Matroska ContentEncryption",
        "encrypted_media before any frame is decoded, every backend", _t(T_VRF, "test_10_cenc_mp4_is_refused",
        "test_10_cenc_packets_are_refused_without_the_box_scan",
        "test_10_matroska_content_encryption_is_refused_by_the_same_code", "test_10_mp4_box_scan_finds_every_marker"),
        SEAMS),
    Row("V18", "MKV / FLV declaring 1000 or 60 fps with frames every 1/30 s", "sampling and duration follow the "
        "presentation times", _t(T_VRF, "test_10_sampling_follows_presentation_times_not_the_declared_rate")
        + _t(T_VID, "test_duration_cap_applies_to_the_presentation_times"), SEAMS),
    Row("V19", "VP9 hidden (alt-ref) frames, in packets of their own and in superframes", "only shown frames counted "
        "and timed; not partial", _t(T_VRF, "test_10_vp9_hidden_frames_are_not_counted_or_timed",
                                     "test_10_shown_frame_bits"), SEAMS),
    Row("V20", "a stream no decoder in PyAV knows", "unsupported_format, sandboxed or not",
        _t(T_VRF, "test_10_a_stream_without_a_decoder_is_unsupported_format"), SEAMS),
    Row("V21", "a decode past video_timeout_s in-process (the CLI path)", "decode_timeout at the first check past "
        "the deadline", _t(T_VID, "test_in_process_deadline_while_indexing", "test_in_process_deadline_while_decoding"),
        SEAMS),
    # --- 6.8 the OpenAI-compatible server (`vl serve`) --------------------------------------------------------------
    Row("H1", "a multi-megabyte text prompt", "context_length 400 with nothing tokenized (counted); RSS flat; a "
        "concurrent short request answered", _t(T_SPS, "test_a_multi_megabyte_prompt_is_a_400_with_nothing_tokenized_and_flat_memory",
        "test_a_long_prompt_is_refused_before_tokenizing_in_every_processor",
        "test_the_bound_is_the_longest_token_and_holds_on_random_text"), SEAMS),
    Row("H2", "one seed >= 2**64 among 25 concurrent requests; a row whose own code fails", "that request 400 (or "
        "500) alone; its batch-mates 200, equal to their single runs", _t(T_SFL,
        "test_one_bad_seed_among_25_concurrent_requests_fails_alone", "test_a_batch_fault_fails_only_the_row_that_causes_it",
        "test_a_row_whose_own_code_fails_ends_alone", "test_sampling_params_refuse_what_would_fail_later"), SEAMS),
    Row("H3", "12 media URLs over a cap of 4 (--allow-fetch); IPv4-compatible, NAT64, 6to4, Teredo forms of "
        "loopback / private addresses", "refused before any fetch (hit count 0); refused by the embedded IPv4",
        _t(T_SMP, "test_item_caps_are_checked_before_any_url_is_fetched",
           "test_ipv6_forms_of_forbidden_ipv4_addresses_are_refused", "test_ipv6_forms_of_public_ipv4_addresses_pass_the_check"),
        SEAMS),
    Row("H4", "logit_bias, min_p, guided_json, best_of, reasoning_effort, an unknown field", "implemented as "
        "defined, or 400 naming the field; never ignored", _t(T_SFL, "test_min_p_and_logit_bias_equal_their_definitions",
        "test_logit_bias_and_min_p_change_the_answer_as_defined", "test_fields_are_implemented_refused_by_name_or_accepted",
        "test_reasoning_effort_maps_to_the_reasoning_toggle")
        + _t(T_SMP, "test_reasoning_follows_the_request_then_the_messages_then_the_default"), SEAMS),
    Row("H5", "JSON nested 100k deep, a 5,000-digit integer, a lone surrogate, %00 in a file:// path, an injected bug",
        "400 with a code (the bug: a JSON 500) on a keep-alive connection that keeps serving",
        _t(T_SED, "test_hostile_bodies_are_typed_400s_on_a_connection_that_stays_open",
           "test_an_unexpected_error_is_a_500_that_keeps_the_connection")
        + _t(T_SMP, "test_no_body_reaches_an_untyped_error", "test_malformed_urls_and_paths_are_400s"), SEAMS),
    Row("H6", "a bad image (plain and streamed), 429, models.retrieve, 405, an unknown /v1 path with a key",
        "400 BadRequestError before any stream; Retry-After; 200 / 404; invalid_request_error; 401; x-request-id "
        "on every response", _t(T_SED, "test_request_ids_routes_and_statuses",
        "test_a_streamed_request_with_a_bad_image_is_an_http_400")
        + _t("tests/server/test_server_openai.py", "test_bad_requests_are_400_with_our_codes",
             "test_too_many_items_is_400_and_bad_json_too", "test_models_and_health"), SEAMS),
    Row("H7", "a client sending its head one byte at a time; a slow body; too many connections; a client that "
        "leaves", "cut off at the header timeout; 408; 503 over the cap; a timestamped log line naming the request",
        _t(T_SED, "test_slow_clients_are_cut_off", "test_the_log_has_timestamps_and_names_a_client_that_went_away"),
        SEAMS),
    # --- 6.8 the client (RemoteEngine) and remote eval ---------------------------------------------------------
    Row("R1", "a stream that ends without finish_reason or [DONE], is cut, stalls; an HTML / JSON 200 to a stream; "
        "a malformed event; a gateway 504", "unavailable (retriable) or bad_server_reply, never an answer; a stall "
        "is not resent; gateway errors retried", _t(T_RPR,
        "test_a_stream_that_ends_without_finish_or_done_is_unavailable_not_an_answer",
        "test_a_connection_cut_mid_stream_is_unavailable", "test_a_stream_with_finish_reason_but_no_done_is_complete",
        "test_a_200_that_is_not_an_event_stream_is_a_protocol_error", "test_a_malformed_event_is_a_protocol_error",
        "test_a_server_that_stops_sending_is_unavailable_after_the_read_timeout",
        "test_a_stall_past_the_callers_deadline_is_a_timeout_with_the_text_so_far",
        "test_gateway_errors_are_retried_then_unavailable", "test_a_refused_connection_is_unavailable"), SEAMS),
    Row("R2", "`vl eval --backend openai`: streams dropped, stalled or cut; the server gone mid-run; no server",
        "records unavailable and redone by --resume; the run stops after 3 unanswered items in a row, exit 1; "
        "nothing answered = no score, not 0", _t(T_RFT,
        "test_dropped_stalled_and_cut_streams_are_redone_by_resume_after_the_server_left_and_came_back",
        "test_a_server_that_goes_away_mid_run_stops_the_run_after_three_items",
        "test_a_run_against_no_server_stops_and_prints_no_score", "test_a_gateway_error_page_and_a_good_answer_next_to_it")
        + _t("tests/eval/test_eval_score.py", "test_nothing_answered_has_no_score_not_zero"), SEAMS),
    Row("R3", "a llama.cpp / vLLM server with a smaller context or no vision", "the served context length; "
        "no_vision; has_vision as the server says", _t(T_RPR, "test_context_length_from_vllm_llama_cpp_and_ours",
        "test_a_server_without_vision_becomes_no_vision"), SEAMS),
    Row("R4", "`vl eval --task synthetic_docs` without its data", "the error names `vl eval make-data`, which writes "
        "what eval reads (twice: byte-identical)", _t("tests/eval/test_make_data.py",
        "test_missing_data_names_make_data_which_writes_what_eval_reads", "test_make_data_refuses_what_it_cannot_make"),
        SEAMS),
    # --- 6.8 the app ----------------------------------------------------------------------------------------------
    Row("A1", "`vl app --backend URL` against a `vl serve`", "starts; every tab answers through the server, streamed, "
        "twice and after an error; what a server does not report says so", _t("tests/ui/test_ui_browser.py",
        "test_browser_app_against_a_remote_server") + _t(T_UIP, "test_the_media_tabs_follow_what_the_engine_says_about_vision"),
        SEAMS),
    Row("A2", "a second PDF in a later chat message; an encrypted one; a text follow-up after a 14-page PDF",
        "caps per message; the new file's own error shown; earlier attachments not rendered again (counted)",
        _t("tests/ui/test_ui_chat_media.py", "test_a_second_pdf_in_a_later_message_is_answered",
           "test_an_encrypted_pdf_in_a_later_message_shows_its_own_error", "test_a_text_follow_up_after_a_pdf_renders_no_page",
           "test_more_than_one_pdf_in_one_message_is_still_refused",
           "test_the_assembled_prompt_equals_the_processor_on_the_whole_conversation",
           "test_the_cache_is_bounded_and_least_recently_used_goes_first"), SEAMS),
    Row("A3", "the app run from the repository folder (`make app`, .venv beside it)", "the Chat tab's icons load; "
        "the folder's files stay blocked", _t("tests/ui/test_ui_browser.py",
        "test_browser_new_chat_icon_loads_when_run_from_the_repository")
        + _t(T_UIP, "test_a_link_towards_a_kept_folder_does_not_block_it",
             "test_the_upload_filters_name_every_image_format_the_decoder_accepts"), SEAMS),
    Row("A4", "an unreadable file in the Document and Video tabs", "the message stays in the status line; Stop off; "
        "no stale stage text or error badges; the next question answered", _t("tests/ui/test_ui_browser.py",
        "test_browser_errors_keep_their_message_and_reset_the_controls"), SEAMS),
    Row("A5", "`vl app` with its port taken", "exit 2 naming --port before the model loads",
        _t(T_UIC, "test_port_in_use_is_refused_before_loading"), SEAMS),
    Row("A9", "redundant-token pruning that its similarity floor stops", "a note with the numbers and the floor, in "
        "the app's stats and `vl chat --json`", _t("tests/token_reduction/test_redundant_tokens.py",
        "test_a_floor_that_stops_the_rate_is_named_in_the_note",
        "test_the_note_counts_a_partly_stopped_rate_and_is_none_when_the_rate_is_met")
        + _t("tests/ui/test_ui_demo_model.py", "test_pruning_that_the_similarity_floor_stops_says_so")
        + _t(T_CLI, "test_the_pruning_note_reaches_json_and_stderr_as_it_is",
             "test_json_stats_carry_every_field_of_the_results_stats"), SEAMS),
    # --- 6.8 the command line -------------------------------------------------------------------------------------
    Row("A6", "a `vl quantize` copy of the demo model", "the synthetic-inputs warning in `vl chat` and the app",
        _t("tests/quant/test_quantize_cli.py", "test_a_quantized_copy_of_the_demo_model_keeps_its_warning"), SEAMS),
    Row("A7", "`vl chat` start-up; `vl quantize --help`", "'loading' said before the model's imports; help without "
        "torch; --max-tiles help true for any checkpoint", _t(T_CLI,
        "test_loading_is_said_before_the_model_modules_are_imported", "test_quantize_help_does_not_import_torch",
        "test_help_says_what_holds_for_any_checkpoint"), SEAMS),
    Row("A8", "reasoning in the CLI, the engine, the pipeline, the server; a limit that ends inside the reasoning",
        "one default (the option, else a message's toggle, else off); no complete answer = exit 3 with a note",
        _t(T_CLI, "test_reasoning_is_off_unless_asked_for", "test_no_complete_answer_exits_3_with_a_note",
           "test_incomplete_note_covers_every_way_to_end_without_an_answer")
        + _t("tests/test_request_options.py", "test_one_reasoning_default_in_every_front_end"), SEAMS),
    # --- 6.9 audio and the sound of a video -----------------------------------------------------------------------
    Row("U1", "an audio file that is not audio, empty, encrypted, a playlist, over a cap", "a typed error with a code, "
        "before decoding where the header allows; the next request answers",
        _t(T_AUD, "test_playlists_and_non_audio_are_refused", "test_empty_broken_and_header_only_files_are_corrupt_media",
           "test_encrypted_audio_is_refused", "test_byte_cap_before_the_file_is_opened",
           "test_header_caps_refuse_before_decoding", "test_a_header_that_lies_is_caught_by_the_decoded_samples")
        + _t(T_OMNI, "test_bad_audio_is_a_typed_error_and_the_next_request_and_its_neighbours_answer")
        + _t(T_SAUD, "test_bad_audio_is_a_typed_400_and_the_next_request_works")),
    Row("U2", "a video whose sound track is missing, corrupt or over the audio caps", "answered from the frames with "
        "a note saying why nothing was heard",
        _t(T_AUD, "test_a_video_without_sound", "test_a_video_whose_sound_track_is_corrupt_still_answers_from_its_frames",
           "test_a_sound_track_over_the_caps_is_a_note_not_an_error")
        + _t(T_OMNI, "test_the_sound_of_a_video_is_optional_and_its_faults_never_cost_the_frames")),
    Row("U3", "audio sent to a model that does not hear", "refused by name before decoding; asked to hear a video, a "
        "note", _t(T_OMNI, "test_a_checkpoint_without_an_audio_encoder", "test_nano_v2_vl_says_it_does_not_hear")
        + _t(T_SAUD, "test_an_omni_checkpoint_without_an_audio_encoder_refuses_audio", "test_the_demo_model_does_not_hear")
        + _t(T_CLI, "test_audio_to_a_model_that_does_not_hear_is_refused_before_it_loads")
        + _t("tests/ui/test_ui_audio.py", "test_a_model_that_does_not_hear_says_so_and_the_next_question_answers")),
    Row("U4", "one bad audio among good requests", "it fails alone; the others answer as alone",
        _t(T_OMNI, "test_bad_audio_is_a_typed_error_and_the_next_request_and_its_neighbours_answer")
        + _t(T_SAUD, "test_one_bad_audio_in_a_concurrent_batch_fails_alone")),
    Row("U5", "the same recording asked about twice", "no encoder runs again; the same answer",
        _t(T_OMNI, "test_a_follow_up_reuses_the_encoders_and_answers_the_same")),
    Row("U6", "ten minutes of audio", "attention memory in query blocks with the whole matrix's maths; audio past the "
        "context refused before any encoder runs",
        _t("tests/modeling/test_parakeet.py", "test_query_blocks_equal_transformers_and_bound_the_attention_memory")
        + _t(T_OMNI, "test_audio_longer_than_the_context_is_refused_before_any_encoder_runs"),
        "a 10-minute video with sound through `vl chat --json` on the tiny Omni: 8.0 GB peak RSS with whole "
        "matrices, 2.0 GB in blocks"),
    Row("U7", "the official `openai` SDK's input_audio, vLLM's audio_url, RemoteEngine", "heard; the engine's answer "
        "on the same bytes", _t(T_SAUD, "test_the_openai_sdk_sends_input_audio_twice_and_gets_the_engines_answer",
                               "test_audio_url_data_uris_in_other_containers",
                               "test_a_videos_sound_track_follows_use_audio_in_video",
                               "test_remote_engine_sends_audio_as_the_engine_takes_it")),
    Row("U8", "the app and `vl chat` on an Omni checkpoint", "an audio question, a follow-up, a bad file among good "
        "ones", _t("tests/ui/test_ui_browser_audio.py", "test_browser_omni_app_answers_about_audio")
        + _t("tests/ui/test_ui_audio.py", "test_an_audio_question_a_follow_up_and_a_bad_file_among_good_ones")
        + _t(T_CLI, "test_an_audio_question_twice_after_a_bad_audio_gives_the_engines_answer",
             "test_a_videos_sound_is_heard_unless_no_audio")),
]


# --- running and reading pytest ------------------------------------------------------------------------
