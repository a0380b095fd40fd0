"""The stages of the latent-variable line: the image and game data, the LVM experiments."""
