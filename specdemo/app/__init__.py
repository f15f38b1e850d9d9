"""The web app: the page's layout and handlers, the pictures drawn from events, running a request, and the hosting
limits. No tensors here."""
