"""A tiny random LLaVA (transformers' own `LlavaForConditionalGeneration`, CLIP vision + Llama text) with its
processor, built offline: another model's image-text-to-text pipeline, to show that `vl` leaves it alone.
Imports nothing from `vl`, so a fresh interpreter can build it without `vl` for comparison."""

import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                          LlavaForConditionalGeneration, LlavaProcessor, PreTrainedTokenizerFast)

WORDS = ["<pad>", "<unk>", "<s>", "</s>", "<image>", "USER:", "ASSISTANT:", "What", "is", "this?"] + \
        [f"w{i}" for i in range(22)]
TEMPLATE = ("{% for m in messages %}{{ m['role'].upper() }}: {% if m['content'] is string %}{{ m['content'] }} "
            "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} "
            "{% endif %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT: {% endif %}")


def tiny_llava(seed: int = 0):
    """(model, processor): 16x16 images, two 8x8 patches a side, one layer each side, 32-word vocabulary."""
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                        eos_token="</s>", extra_special_tokens={"image_token": "<image>"})
    images = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=8, chat_template=TEMPLATE,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, image_size=16, patch_size=8),
        text_config=LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, num_key_value_heads=1, pad_token_id=0, bos_token_id=2,
                                eos_token_id=3),
        image_token_id=WORDS.index("<image>"), vision_feature_select_strategy="default", vision_feature_layer=-1)
    torch.manual_seed(seed)
    return LlavaForConditionalGeneration(config).eval(), processor


def red() -> Image.Image:
    return Image.new("RGB", (20, 20), "red")


def chat(image=None, text="What is this?"):
    return [{"role": "user", "content": [{"type": "image", "image": image if image is not None else red()},
                                         {"type": "text", "text": text}]}]
