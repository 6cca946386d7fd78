"""How a mask is held: the reparametrization and the lean masks."""
