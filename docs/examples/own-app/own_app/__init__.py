"""A Flower user's own app on silofl: FedProx-SPIDER with Grad-BANT (server), PrivateSilo (silos)."""
