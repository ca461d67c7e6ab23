"""The HTTP edge and the pages: the uvicorn server and its guards, login, the upload cache, the OpenAI-compatible
routes, the main page and the teaching page. The model behind them is serving's; every door calls it through
serving.surface.InferenceSurface."""
