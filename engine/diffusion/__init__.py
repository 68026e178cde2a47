"""Text-to-image diffusion on the device: schedulers of Ferry's own (``schedulers``, over the noise
schedule in ``schedule``), the CLIP tokenizer (``tokenizer``), the package's files (``package``)
and the pipeline (``pipeline``: text encoder, UNet loop with classifier-free guidance, VAE decode,
each graph an ``engine.Session`` loaded only while it runs)."""
