"""Operations: settings, model resolution and download, start-up, serving, Codex set-up."""
