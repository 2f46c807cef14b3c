"""Local stand-ins for outside services, answering like the real ones."""
