"""Grid studies: a base configuration x grid axes and variants, trained as cells, analysed by
steps, reported by sections."""
