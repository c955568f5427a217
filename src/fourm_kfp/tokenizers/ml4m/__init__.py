"""apple/ml-4m's tokenizers (the Hugging Face folders ``EPFL-VILAB/4M_tokenizers_*``) without an ml-4m dependency.

A folder is ``config.json`` (the constructor arguments) beside ``model.safetensors``, local or ``s3://``
(:mod:`.folder`: loaded as leniently as ml-4m loads it, unused tensors reported and ignored, missing ones refused).
Its network is built from the config (never by name from a hub) with ml-4m's parameter names:

* :mod:`.vit`: the ViT encoder and decoder; :mod:`.mlp`: the MLP ones (global features, human poses);
* :mod:`.quantizers`: the lucid VQ (cosine-similarity codebooks) and Memcodes;
* :mod:`.vqvae`: the encoder every tokenizer shares (:class:`~.vqvae.VQEncoder`, ``encode(x) -> codes``,
  ``tokens_to_embedding``) and the VQ-VAE (:class:`~.vqvae.VQVAE`, ``decode_tokens(codes)``);
* :mod:`.unet`, :mod:`.uvit`, :mod:`.sampling`, :mod:`.divae`: the diffusion decoders (rgb, depth, normal, edge):
  ml-4m's patched UNet or its UViT (the edge tokenizer's), sampled on diffusers' DDPM or DDIM scheduler set to
  ml-4m's schedule (the folder's ``scheduler``, ml-4m's default DDPM), 25 steps by default, 10 for edges;
* :mod:`.conventions`: each modality's input as ml-4m's transforms make it (rgb, depth, normals, semseg ids,
  CLIP / DINOv2 feature maps).

``bench/ml4m_tokenizer_compare.py`` and ``bench/ml4m_divae_compare.py`` check the port against codes and reconstructions made by ml-4m's own code
(``tests/tokenizers/ml4m_reference/``).
"""

from fourm_kfp.tokenizers.ml4m.folder import TokenizerFolder, TokenizerFolderError, load_into, read_folder
from fourm_kfp.tokenizers.ml4m.vqvae import VQVAE, VQConfig, VQEncoder, load_vq_encoder, load_vqvae

__all__ = ["VQVAE", "TokenizerFolder", "TokenizerFolderError", "VQConfig", "VQEncoder", "load_into",
           "load_vq_encoder", "load_vqvae", "read_folder"]
