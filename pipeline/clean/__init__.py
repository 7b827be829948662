"""pipe clean: discover -> process each file in workers -> decide over all results -> write the folder."""

# What the workers import, all of it at start-up rather than on their first file: the fork
# server imports these once, and every worker forks from it ready (see pipeline.core.executor).
# Here, not in pipeline.clean.process, so that `pipe clean` can start that server before it
# imports anything else.
WORKER_MODULES = ("pipeline.clean.process", "pipeline.media.image.decode", "pipeline.media.image.resize",
                  "pipeline.similarity.perceptual", "pipeline.media.text.encodings", "pipeline.formats.sample",
                  "cykooz_resizer", "simplejpeg", "xxhash")
