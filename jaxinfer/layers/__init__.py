"""Model building blocks shared by the model definitions (attention backends, linear methods)."""
